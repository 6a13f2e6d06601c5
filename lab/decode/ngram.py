"""Prompt lookup (n-gram) drafts: propose what followed the latest earlier occurrence of the text's last n tokens.

No weights and no forward: the drafts are copied from the sequence itself (the prompt and the
emitted output), which pays off on text that repeats itself (code, quoting, extraction). The
proposal is a deterministic function of the emitted tokens, so its law is a point mass: greedy
verification accepts a draft iff it is the target's argmax, and speculative sampling accepts
draft y with probability p(y) and after a rejection draws from p with y removed
(lab.decode_core.acceptance), which keeps the output law exact.

`NgramIndex` keeps, per n-gram, where its latest occurrence ended, updated with the tokens
committed since the last round (work per round grows with the tokens emitted, never with the
text's length). Sizes are tried longest first; the first size with an earlier occurrence wins.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from lab.errors import is_int, require, require_bool, require_number
from lab.decode_core.tree import NGRAM_HORIZON, ProposalBuffer, TreeShape

DEFAULT_SIZES = (3, 2, 1)
DEFAULT_MAX_DRAFT = 10
METHODS = ("ngram", "suffix")  # lab/decode/ngram.py NgramIndex, lab/decode/suffix.py SuffixIndex
COMBINES = ("graft", "choose")  # with heads: the lookup chain grafted into their tree, or one drafter per round (lab/decode/choose.py)
OCCURRENCES = ("latest", "earliest", "both")  # both: the latest occurrence's copy, the earliest's grafted as a second branch


@dataclass(frozen=True)
class PromptLookup:
    """Settings of the lookup proposers (drafts copied from the prompt and the output so far).

    sizes         ngram: n-gram lengths tried, longest first
    max_draft     draft tokens per round at most
    with_heads    draft with the model's heads too
    method        ngram: what followed an earlier occurrence of the last n tokens; suffix: a suffix trie of the
                  text with occurrence counts, drafts along its most frequent continuation (SuffixDecoding)
    combine       with heads: graft (the lookup chain becomes one more branch of the heads' tree, both verified
                  every round) or choose (one drafter per round: the lookup's chain when its match is at least
                  min_match tokens long, else the heads')
    min_match     choose: the shortest match the lookup drafts on
    occurrence    ngram: copy after the latest or the earliest earlier occurrence, or both (two branches of one tree)
    loop          a draft that reaches the end of the text goes on copying from itself (a repeat of period p drafts
                  beyond p tokens); off, it stops there
    spec_factor   draft at most ceil(spec_factor × match length) tokens (null: max_draft whatever the match)
    max_depth     suffix: the longest substring the trie holds (the match plus its draft)
    min_token_prob  suffix: stop where the continuation's share of the matched text's continuations falls below
    """

    sizes: tuple[int, ...] = DEFAULT_SIZES
    max_draft: int = DEFAULT_MAX_DRAFT
    with_heads: bool = True
    method: str = "ngram"
    combine: str = "graft"
    min_match: int = 2
    occurrence: str = "latest"
    loop: bool = False
    spec_factor: float | None = None
    max_depth: int = 24
    min_token_prob: float = 0.1

    def __post_init__(self):
        sizes = tuple(self.sizes) if isinstance(self.sizes, (list, tuple)) else ()
        require(bool(sizes) and all(is_int(n) and n >= 1 for n in sizes), "ngram.sizes",
                f"must be a non-empty list of n-gram lengths ≥ 1 (e.g. [3, 2, 1]), got {self.sizes!r}")
        require(is_int(self.max_draft) and self.max_draft >= 1, "ngram.max_draft",
                f"must be an int ≥ 1 (draft tokens per round), got {self.max_draft!r}")
        for field, allowed in (("method", METHODS), ("combine", COMBINES), ("occurrence", OCCURRENCES)):
            require(getattr(self, field) in allowed, f"ngram.{field}", f"unknown {getattr(self, field)!r}; allowed: {', '.join(allowed)}")
        require(is_int(self.min_match) and self.min_match >= 1, "ngram.min_match",
                f"must be an int ≥ 1 (tokens of match before the lookup drafts), got {self.min_match!r}")
        require(is_int(self.max_depth) and self.max_depth >= 2, "ngram.max_depth",
                f"must be an int ≥ 2 (a match of one token and one draft), got {self.max_depth!r}")
        require_number(self.min_token_prob, "ngram.min_token_prob", low=0, high=1, open_low=True, open_high=True)
        require_number(self.spec_factor, "ngram.spec_factor", low=0, open_low=True, optional=True)
        require_bool(self.loop, "ngram.loop")
        object.__setattr__(self, "sizes", tuple(sorted(set(sizes), reverse=True)))
        for name, (switch, value) in READ_ONLY_WITH.items():  # a setting nothing reads would change nothing: refused
            default = next(f.default for f in dataclasses.fields(self) if f.name == name)
            require(getattr(self, name) == default or getattr(self, switch) == value, f"ngram.{name}",
                    f"only {switch}={value} reads it (it would change nothing with {switch}={getattr(self, switch)}); allowed: {default!r}")

    def check_context(self, context: int | None) -> None:
        """A round verifies the frontier and up to max_draft drafts after at least one committed token: they must fit the context."""
        if context is not None:
            require(self.max_draft < context - 1, "ngram.max_draft",
                    f"must be < {context - 1}: a round of {self.max_draft} drafts does not fit the model's context of {context} positions")

    def draft_limit(self, match: int, m: int) -> int:
        """Drafts a match of `match` tokens may propose this round (m: the round's room)."""
        limit = min(m, self.max_draft)
        return limit if self.spec_factor is None else min(limit, math.ceil(self.spec_factor * match))


# The settings only one method or combination reads: name -> (the switch, its value that reads it).
READ_ONLY_WITH = {"sizes": ("method", "ngram"), "occurrence": ("method", "ngram"), "max_depth": ("method", "suffix"),
                  "min_token_prob": ("method", "suffix"), "min_match": ("combine", "choose")}


def copy_on(text: list[int], start: int, limit: int, loop: bool) -> list[int]:
    """Up to `limit` tokens from text[start]; with `loop`, each copied token extends the text it copies from, so a
    copy that reaches the end continues along the repeat (period len(text) − start)."""
    if not loop:
        return text[start : start + limit]
    extended = list(text)
    for k in range(limit):
        extended.append(extended[start + k])
    return extended[len(text) :]


class NgramIndex:
    """The latest (or earliest) occurrence of every n-gram (of the configured sizes) of one growing token sequence."""

    def __init__(self, sizes: tuple[int, ...], earliest: bool = False):
        self.sizes, self.earliest = sizes, earliest
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its latest (earliest) indexed occurrence
        self.indexed = 0  # occurrences ending at ≤ this index are in `ends`

    def find(self, text: list[int]) -> tuple[int, int | None]:
        """(n, end): the longest size n whose last n tokens occurred earlier, and where that occurrence ended; (0, None)."""
        self._index(text, len(text) - 1)  # an occurrence must end before the text does (a token must follow it)
        for n in self.sizes:
            if n <= len(text):
                end = self.ends.get(tuple(text[len(text) - n :]))
                if end is not None:
                    return n, end
        return 0, None

    def lookup(self, text: list[int], limit: int, loop: bool = False) -> list[int]:
        """Up to `limit` tokens that followed the chosen earlier occurrence of text's longest matching suffix n-gram."""
        _, end = self.find(text)
        return [] if end is None else copy_on(text, end, limit, loop)

    def _index(self, text: list[int], until: int) -> None:
        for end in range(self.indexed + 1, until + 1):  # the tokens committed since the last round
            for n in self.sizes:
                if n <= end:
                    key = tuple(text[end - n : end])
                    if not (self.earliest and key in self.ends):
                        self.ends[key] = end
        self.indexed = max(self.indexed, until)


class NgramProposer:
    """Prompt lookup behind the proposer interface: a chain of up to `max_draft` point-mass drafts (none when nothing matches)."""

    name = "prompt lookup"

    def __init__(self, state, settings: PromptLookup, vocab_identity: str):
        self.state, self.settings, self.vocab = state, settings, vocab_identity
        occurrences = ("latest", "earliest") if settings.occurrence == "both" else (settings.occurrence,)
        self.indexes = [NgramIndex(settings.sizes, earliest=which == "earliest") for which in occurrences]  # the first drafts the chain
        self.max_drafts = settings.max_draft

    def match(self, tokens: list[int], frontier: int, m: int) -> tuple[int, list[int]]:
        """(match length, drafts of the first occurrence kind) after the emitted text tokens + [frontier]."""
        length, chains = self.branches(tokens, frontier, m)
        return length, chains[0] if chains else []

    def branches(self, tokens: list[int], frontier: int, m: int) -> tuple[int, list[list[int]]]:
        """(match length, one draft chain per occurrence kind); every index matches the same n-gram, so one length."""
        text, chains, length = tokens + [frontier], [], 0
        for index in self.indexes:
            n, end = index.find(text)
            if end is not None:
                length = n
                chains.append(copy_on(text, end, self.settings.draft_limit(n, m), self.settings.loop))
        return length, chains

    def drafts(self, tokens: list[int], frontier: int, m: int) -> list[int]:
        return self.match(tokens, frontier, m)[1]

    def propose(self, tokens: list[int], frontier: int, m: int, chooser) -> ProposalBuffer:
        chains = self.branches(tokens, frontier, m)[1] or [[]]
        buffer = point_mass_chain(self.state.length, frontier, chains[0], self.name, self.vocab)
        for chain in chains[1:]:
            buffer = buffer.graft(chain)  # shares the prefix it has in common with the first, then branches
        return dataclasses.replace(buffer, head_identity=self.name)  # one drafter, whatever the branches

    def after_verify(self, target_pass, rows: list[int]) -> None:
        """Nothing to update: the index reads the committed tokens themselves."""


def point_mass_chain(version: int, frontier: int, drafts: list[int], name: str, vocab: str) -> ProposalBuffer:
    """A chain of deterministic drafts after the frontier (their law: all mass on their token)."""
    shape = TreeShape.chain(len(drafts))
    return ProposalBuffer(version, shape, [frontier, *drafts], [0] + [NGRAM_HORIZON] * len(drafts), [None] * len(drafts),
                          None, name, vocab, frozenset(range(1, shape.size)))


class HeadsWithNgram:
    """The heads' chain or tree with the n-gram chain merged in as one more branch (lab.decode_core.tree.ProposalBuffer.graft)."""

    def __init__(self, heads, ngram: NgramProposer):
        self.heads, self.ngram = heads, ngram
        self.max_drafts = max(heads.max_drafts, ngram.max_drafts)

    @property
    def draft_blocks_s(self) -> float:
        return getattr(self.heads, "draft_blocks_s", 0.0)

    def propose(self, tokens: list[int], frontier: int, m: int, chooser) -> ProposalBuffer:
        buffer = self.heads.propose(tokens, frontier, min(m, self.heads.max_drafts), chooser)
        for chain in self.ngram.branches(tokens, frontier, m)[1]:
            buffer = buffer.graft(chain)
        return buffer

    def after_verify(self, target_pass, rows: list[int]) -> None:
        self.heads.after_verify(target_pass, rows)

"""Prompt lookup (n-gram) drafts: propose what followed the latest earlier occurrence of the text's last n tokens.

No weights and no forward: the drafts are copied from the sequence itself (the prompt and the
emitted output), which pays off on text that repeats itself (code, quoting, extraction). The
proposal is a deterministic function of the emitted tokens, so its law is a point mass: greedy
verification accepts a draft iff it is the target's argmax, and speculative sampling accepts
draft y with probability p(y) and after a rejection draws from p with y removed
(lab.inference.acceptance), which keeps the output law exact.

`NgramIndex` keeps, per n-gram, where its latest occurrence ended, updated with the tokens
committed since the last round (work per round grows with the tokens emitted, never with the
text's length). Sizes are tried longest first; the first size with an earlier occurrence wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from lab.errors import require
from lab.inference.tree import NGRAM_HORIZON, ProposalBuffer, TreeShape

DEFAULT_SIZES = (3, 2, 1)
DEFAULT_MAX_DRAFT = 10


@dataclass(frozen=True)
class PromptLookup:
    """Settings of the n-gram proposer: `sizes` n-gram lengths tried (longest first), `max_draft` tokens per round at most,
    `with_heads`: draft with the model's heads too (the n-gram chain becomes one more branch of their tree)."""

    sizes: tuple[int, ...] = DEFAULT_SIZES
    max_draft: int = DEFAULT_MAX_DRAFT
    with_heads: bool = True

    def __post_init__(self):
        sizes = tuple(self.sizes) if isinstance(self.sizes, (list, tuple)) else ()
        require(bool(sizes) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes), "ngram.sizes",
                f"must be a non-empty list of n-gram lengths ≥ 1 (e.g. [3, 2, 1]), got {self.sizes!r}")
        require(isinstance(self.max_draft, int) and not isinstance(self.max_draft, bool) and self.max_draft >= 1, "ngram.max_draft",
                f"must be an int ≥ 1 (draft tokens per round), got {self.max_draft!r}")
        object.__setattr__(self, "sizes", tuple(sorted(set(sizes), reverse=True)))

    def check_context(self, context: int | None) -> None:
        """A round verifies the frontier and up to max_draft drafts after at least one committed token: they must fit the context."""
        if context is not None:
            require(self.max_draft < context - 1, "ngram.max_draft",
                    f"must be < {context - 1}: a round of {self.max_draft} drafts does not fit the model's context of {context} positions")


class NgramIndex:
    """Latest occurrence of every n-gram (of the configured sizes) of one growing token sequence."""

    def __init__(self, sizes: tuple[int, ...]):
        self.sizes = sizes
        self.latest: dict[tuple[int, ...], int] = {}  # n-gram -> end (exclusive) of its latest indexed occurrence
        self.indexed = 0  # occurrences ending at ≤ this index are in `latest`

    def lookup(self, text: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of text's longest matching suffix n-gram."""
        self._index(text, len(text) - 1)  # an occurrence must end before the text does (a token must follow it)
        for n in self.sizes:
            if n <= len(text):
                end = self.latest.get(tuple(text[len(text) - n :]))
                if end is not None:
                    return text[end : end + limit]
        return []

    def _index(self, text: list[int], until: int) -> None:
        for end in range(self.indexed + 1, until + 1):  # the tokens committed since the last round
            for n in self.sizes:
                if n <= end:
                    self.latest[tuple(text[end - n : end])] = end
        self.indexed = max(self.indexed, until)


class NgramProposer:
    """Prompt lookup behind the proposer interface: a chain of up to `max_draft` point-mass drafts (none when nothing matches)."""

    def __init__(self, state, settings: PromptLookup, vocab_identity: str):
        self.state, self.settings, self.vocab = state, settings, vocab_identity
        self.index = NgramIndex(settings.sizes)
        self.max_drafts = settings.max_draft

    def drafts(self, tokens: list[int], frontier: int, m: int) -> list[int]:
        return self.index.lookup(tokens + [frontier], min(m, self.max_drafts))

    def propose(self, tokens: list[int], frontier: int, m: int, chooser) -> ProposalBuffer:
        drafts = self.drafts(tokens, frontier, m)
        shape = TreeShape.chain(len(drafts))
        return ProposalBuffer(self.state.length, shape, [frontier, *drafts], [0] + [NGRAM_HORIZON] * len(drafts), [None] * len(drafts),
                              None, "prompt lookup", self.vocab, frozenset(range(1, shape.size)))

    def after_verify(self, target_pass, rows: list[int]) -> None:
        """Nothing to update: the index reads the committed tokens themselves."""


class HeadsWithNgram:
    """The heads' chain or tree with the n-gram chain merged in as one more branch (lab.inference.tree.ProposalBuffer.graft)."""

    def __init__(self, heads, ngram: NgramProposer):
        self.heads, self.ngram = heads, ngram
        self.max_drafts = max(heads.max_drafts, ngram.max_drafts)

    @property
    def draft_blocks_s(self) -> float:
        return getattr(self.heads, "draft_blocks_s", 0.0)

    def propose(self, tokens: list[int], frontier: int, m: int, chooser) -> ProposalBuffer:
        buffer = self.heads.propose(tokens, frontier, min(m, self.heads.max_drafts), chooser)
        return buffer.graft(self.ngram.drafts(tokens, frontier, m))

    def after_verify(self, target_pass, rows: list[int]) -> None:
        self.heads.after_verify(target_pass, rows)

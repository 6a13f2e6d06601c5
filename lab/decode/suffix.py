"""Suffix drafts (SuffixDecoding, arXiv 2411.04975): a trie of every substring of the text up to `max_depth` tokens,
with how often each occurred; drafts follow the most frequent continuation of the longest matched suffix.

The trie is built incrementally: appending token t extends the node of every substring that ended at
the previous token and is shorter than `max_depth` (plus the root), so a token costs O(max_depth)
dict operations and the text is never rescanned. Those extended nodes are, by length, exactly the
suffixes of the text, which is how a round finds its match in O(max_depth): the longest suffix whose
node has children (an earlier occurrence that was followed by something; the current occurrence has
none yet), at most `max_depth − max_draft` tokens long so that the trie holds a full draft below it
(a longer match would leave the draft only the trie's remaining depth). From there the draft takes, step by step, the child that occurred most often (ties: the
most recent), while its share of the node's continuations is at least `min_token_prob`, up to the
trie's depth, `max_draft` and (with `spec_factor`) ceil(spec_factor × match length) tokens. With
`loop`, a draft that runs out of trie copies on from the latest occurrence of what it has matched
and drafted (lab/decode/ngram.py `copy_on`), so a repeating text drafts through its own period.

Like prompt lookup the drafts are a deterministic function of the emitted tokens: point masses,
verified exactly (lab.decode_core.acceptance).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.decode.ngram import PromptLookup, copy_on, point_mass_chain


@dataclass(eq=False)
class SuffixNode:
    count: int = 0  # occurrences of the substring this node spells
    last_end: int = 0  # end (exclusive) of its latest occurrence
    children: dict[int, "SuffixNode"] = field(default_factory=dict)


class SuffixIndex:
    """Substrings of one growing token sequence, up to `max_depth` tokens, with their counts."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = SuffixNode()
        self.text: list[int] = []
        self.suffixes: list[SuffixNode] = []  # suffixes[L - 1]: the node of the text's last L tokens (L < max_depth)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            grown = []
            for node in [self.root, *self.suffixes]:  # every suffix of length 0..max_depth-1 takes one more token
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = SuffixNode()
                child.count += 1
                child.last_end = len(self.text) + 1
                grown.append(child)
            self.text.append(token)
            self.suffixes = grown[: self.max_depth - 1]  # a node at max_depth is never extended

    def sync(self, text: list[int]) -> None:
        """Index what `text` adds to the indexed text (the committed tokens and the frontier since the last round)."""
        self.extend(text[len(self.text) :])

    def match(self, longest: int | None = None) -> tuple[int, SuffixNode | None]:
        """(L, node): the longest suffix of the text (of at most `longest` tokens) that occurred earlier followed by a token;
        (0, None) when none did."""
        for length in range(min(len(self.suffixes), longest or len(self.suffixes)), 0, -1):
            node = self.suffixes[length - 1]
            if node.children:
                return length, node
        return 0, None

    def continuation(self, node: SuffixNode, depth: int, limit: int, min_share: float) -> tuple[list[int], SuffixNode]:
        """The most frequent path below `node` (at `depth` tokens) while each step's share is ≥ min_share."""
        drafts = []
        while len(drafts) < limit and node.children and depth < self.max_depth:
            total = sum(child.count for child in node.children.values())
            token, child = max(node.children.items(), key=lambda item: (item[1].count, item[1].last_end))
            if child.count < min_share * total:
                break
            drafts.append(token)
            node, depth = child, depth + 1
        return drafts, node


class SuffixProposer:
    """The suffix trie behind the proposer interface: a chain of point-mass drafts along the most frequent continuation."""

    name = "suffix lookup"

    def __init__(self, state, settings: PromptLookup, vocab_identity: str):
        self.state, self.settings, self.vocab = state, settings, vocab_identity
        self.index = SuffixIndex(settings.max_depth)
        self.max_drafts = settings.max_draft

    def match(self, tokens: list[int], frontier: int, m: int) -> tuple[int, list[int]]:
        """(match length, drafts) after the emitted text tokens + [frontier]."""
        text = tokens + [frontier]
        self.index.sync(text)
        room = min(m, self.settings.max_draft)
        length, node = self.index.match(longest=max(1, self.settings.max_depth - room))  # the trie must hold the match + its draft
        if node is None:
            return 0, []
        limit = self.settings.draft_limit(length, m)
        drafts, last = self.index.continuation(node, length, limit, self.settings.min_token_prob)
        if self.settings.loop and len(drafts) < limit and not last.children:
            # the matched text + drafts last occurred ending at last_end: copy on from there, through the drafts themselves
            drafts += copy_on(text + drafts, last.last_end, limit - len(drafts), loop=True)
        return length, drafts

    def drafts(self, tokens: list[int], frontier: int, m: int) -> list[int]:
        return self.match(tokens, frontier, m)[1]

    def branches(self, tokens: list[int], frontier: int, m: int) -> tuple[int, list[list[int]]]:
        """(match length, its one chain): the n-gram proposer's interface, where `occurrence=both` gives two."""
        length, drafts = self.match(tokens, frontier, m)
        return length, [drafts] if drafts else []

    def propose(self, tokens: list[int], frontier: int, m: int, chooser):
        return point_mass_chain(self.state.length, frontier, self.match(tokens, frontier, m)[1], self.name, self.vocab)

    def after_verify(self, target_pass, rows: list[int]) -> None:
        """Nothing to update: the index reads the committed tokens themselves."""

"""Combining drafters by choosing, not concatenating: one drafter per round, and heads that stop where they are unsure.

`ChoosePerRound`: each round asks the lookup (n-gram or suffix) for its match first; a match of at
least `min_match` tokens drafts alone, otherwise the heads draft (vLLM's n-gram-else-EAGLE, SAM-Decoding's
switch by match length). Verifying both every round (`HeadsWithNgram`, the graft) costs the rows of
both for the accepted tokens of one; here a round verifies one proposal.

`ConfidenceGated`: the heads' proposal cut where the head is unsure (with the node's descendants, and its
later-ranked siblings, so the tree stays rank-closed). Greedy: a draft stays when its own probability under
the head is ≥ `threshold`. Sampling: a node stays when the law it was drawn from has a top probability
≥ `threshold` — decided by what was known *before* its draw, never by the token drawn: a gate on the drawn
token's own probability would replace exactly the low-probability draws by a draw from the target and bias
the output (the enumeration test catches it). Stopping a chain or a sibling list on what precedes the draw
keeps speculative sampling exact: each position either draws and is accepted or rejected as usual, or the
target samples it.

Both decisions read only the emitted text and the drafter's own probabilities, never the target's, so
verification stays exact: greedy output is plain greedy's, and sampling keeps the target's law.
"""

from __future__ import annotations

from lab.decode_core.tree import ProposalBuffer


class ChoosePerRound:
    """The lookup's chain when its match is ≥ `min_match` tokens, else the heads' proposal."""

    def __init__(self, heads, lookup, min_match: int):
        self.heads, self.lookup, self.min_match = heads, lookup, min_match
        self.max_drafts = max(heads.max_drafts, lookup.max_drafts)

    @property
    def draft_blocks_s(self) -> float:
        return getattr(self.heads, "draft_blocks_s", 0.0)

    def propose(self, tokens: list[int], frontier: int, m: int, chooser) -> ProposalBuffer:
        length, drafts = self.lookup.match(tokens, frontier, m)
        if length >= self.min_match and drafts:
            return self.lookup.propose(tokens, frontier, m, chooser)  # its chain (or its branches: occurrence=both)
        return self.heads.propose(tokens, frontier, min(m, self.heads.max_drafts), chooser)

    def after_verify(self, target_pass, rows: list[int]) -> None:
        self.heads.after_verify(target_pass, rows)  # the heads read every pass, whoever drafted


class ConfidenceGated:
    """The heads' proposals without the drafts whose own probability is below `threshold`."""

    def __init__(self, heads, threshold: float):
        self.heads, self.threshold = heads, threshold
        self.max_drafts = heads.max_drafts
        self.drafts_trees = getattr(heads, "drafts_trees", False)

    @property
    def draft_blocks_s(self) -> float:
        return getattr(self.heads, "draft_blocks_s", 0.0)

    def propose(self, tokens: list[int], frontier: int, m: int, chooser) -> ProposalBuffer:
        buffer = self.heads.propose(tokens, frontier, m, chooser)
        return buffer.pruned([node for node, sure in enumerate(confidence_of(buffer)) if sure >= self.threshold])

    def after_verify(self, target_pass, rows: list[int]) -> None:
        self.heads.after_verify(target_pass, rows)


def confidence_of(buffer: ProposalBuffer) -> list[float]:
    """Per node (1 for the root and point masses): greedy, the node's own probability under the head; sampling, the top
    probability of the law its token was drawn from (known before the draw). One softmax per draft position."""
    shape, out = buffer.shape, [1.0] * buffer.shape.size
    for depth in range(1, shape.depth + 1):
        nodes = [n for n in range(1, shape.size) if shape.depths[n] == depth and n not in buffer.point_masses]
        if not nodes:
            continue
        laws = buffer.candidate_probs[depth - 1] if depth - 1 < len(buffer.candidate_probs) else None  # [b_j, V] sampling; None greedy
        if laws is not None:
            values = laws[[shape.ranks[n] for n in nodes]].amax(-1)  # [n_j]
        else:
            values = buffer.draft_logits[depth - 1].double().softmax(-1)[[buffer.tokens[n] for n in nodes]]  # [n_j]
        for node, value in zip(nodes, values.tolist()):
            out[node] = value
    return out

"""Exact acceptance of draft tokens against the target model.

Greedy (temperature 0): a draft is accepted iff it equals the target's argmax at the row
that predicts it; the first mismatch is replaced by that argmax. Sampling: draft i is
accepted with probability min(1, p_i(y_i) / q_i(y_i)); the first rejection emits a draw
from the normalised positive part of p_i − q_i; when every draft passes, a bonus token is
drawn from the target at the row after the last draft. Either way the emitted tokens have
exactly the law of plain decoding (Leviathan et al. 2023; Chen et al. 2023).

`select_mtp_one` is the one-proposal selector (docs/api.md) with its full contract on
plain Python sequences (EOS and output budget included); `accept_tree` is the tensor
version the decoder runs, for a chain of drafts or a tree of candidates (`select`: a chain).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from lab.decode_core.sampling import TokenChooser
from lab.decode_core.tree import ProposalBuffer, TreeShape


def _check_distribution(values: Sequence[float], size: int) -> None:
    if len(values) != size or size == 0:
        raise ValueError("aligned normalized distributions required: p, q and bonus_p need one equal, non-zero length")
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ValueError("aligned normalized distributions required: entries must be finite and ≥ 0")
    if abs(math.fsum(values) - 1.0) > 1e-12:
        raise ValueError("aligned normalized distributions required: entries must sum to 1 (within 1e-12)")


def select_mtp_one(p, q, y, bonus_p, u, sample: Callable[[list[float]], int], *, remaining: int, eos: int | None = None) -> dict:
    """One carried-frontier round's output decision for a single proposal y ~ q.

    p: target distribution at the frontier's row (it predicts y's slot); bonus_p: target
    distribution at y's row; remaining: free output slots (the incoming frontier is not
    counted). An accepted y that is EOS or fills the last slot gets no bonus.
    """
    if type(remaining) is not int or remaining < 1:
        raise ValueError("remaining must be an int ≥ 1 (at least one new output slot)")
    for values in (p, q, bonus_p):
        _check_distribution(values, len(p))
    if type(y) is not int or not 0 <= y < len(q) or not q[y] > 0:
        raise ValueError("the proposal y must be a token id with q[y] > 0 (drawn from the draft's support)")
    if not 0 <= u < 1:
        raise ValueError("the uniform draw u must lie in [0, 1)")

    accepted = u < min(1.0, p[y] / q[y])
    if accepted:
        new_tokens = [y]
        if remaining > 1 and y != eos:
            new_tokens.append(sample(list(bonus_p)))
        rows_to_keep = 2  # the frontier's row and y's row are both target-verified
        pending = new_tokens[-1] if len(new_tokens) == 2 else None
    else:
        positive = [max(pi - qi, 0.0) for pi, qi in zip(p, q)]
        mass = math.fsum(positive)
        if not mass > 0:
            raise ValueError("a rejection needs positive residual mass in p - q")
        correction = sample([v / mass for v in positive])
        new_tokens = [correction]
        rows_to_keep = 1  # only the frontier's row: y's row consumed a rejected token
        pending = correction
    return {
        "accepted": accepted,
        "new_tokens": new_tokens,
        "target_rows_to_keep": rows_to_keep,
        "pending_frontier": pending,
        "stopped": len(new_tokens) == remaining or new_tokens[-1] == eos,
    }


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The law after a rejected draw from q: the normalised positive part of p − q ([V] each)."""
    positive = (p - q).clamp_min(0.0)  # [V]: where the target has more mass than the draw's law
    mass = positive.sum()
    # mass > 0 whenever a rejection can happen (p(y) < q(y)); equal p and q reject only by rounding.
    return positive / mass if mass > 0 else p


def without(p: torch.Tensor, y: int) -> torch.Tensor:
    """The law after rejecting a point-mass proposal y: p with y removed, renormalised (the residual of p − δ_y)."""
    positive = p.clone()
    positive[y] = 0.0  # [V]
    return positive / positive.sum()  # a rejection of y had probability 1 − p(y) > 0, so mass is left


def accept_tree(buffer: ProposalBuffer, target_logits: torch.Tensor, chooser: TokenChooser,
                forced: list[int] | None = None) -> tuple[list[int], int]:
    """(accepted path: node ids from the root's child down, the token after it: correction or bonus).

    target_logits: [n, V]; row i is the target's prediction for the slot after node i
    (its ancestors and itself as context). Greedy: follow the child whose token is the
    target's argmax while one exists; the argmax at the last node reached is the next
    token. Sampling (multi-candidate speculative sampling with recursive rejection): at a
    node with target law p, try its children in rank order; child r, drawn from q_r,
    passes with probability min(1, p(y)/q_r(y)); after a rejection p becomes the
    normalised positive part of p − q_r (the rejected token loses all its mass), so the
    token leaving the node has law p exactly; if every child fails, the correction is a
    draw from the last residual. A leaf's bonus is a draw from its target law.
    `forced` (greedy only, a replay: lab.decode.follow): per node, the target's choice in place of its argmax.
    """
    shape, path, node = buffer.shape, [], 0
    if chooser.greedy:
        choice = target_logits.argmax(dim=-1).tolist() if forced is None else forced  # [n]: one host sync for the whole tree
        while True:
            follow = [c for c in shape.children[node] if buffer.tokens[c] == choice[node]]
            if not follow:
                return path, choice[node]
            node = follow[0]  # candidates of a position are distinct: at most one matches
            path.append(node)
    draws = chooser.draws
    while True:
        # [V] float64, for the nodes the walk reaches only: a tree of n nodes visits about its accepted
        # depth + 1 of them, and the V-wide law of every node (n × V float64) was most of a T = 1 round's host time
        p = chooser.probs(target_logits[node])
        for child in shape.children[node]:
            y, q = buffer.tokens[child], buffer.law(child)  # q: [V], or None for a point mass on y
            if draws.accept(min(1.0, (p[y] if q is None else p[y] / q[y]).item())):
                break
            p = residual(p, q) if q is not None else without(p, y)
        else:
            return path, draws.sample(p)  # every child failed (or a leaf: p is its target law, the bonus)
        node = child
        path.append(node)


def select(drafts: list[int], draft_probs: list[torch.Tensor | None], target_logits: torch.Tensor, chooser: TokenChooser) -> tuple[int, int]:
    """Chain form of `accept_tree`: (number of drafts accepted j, the token after them: correction or bonus).

    target_logits: [m+1, V]; row i is the target's prediction for draft i's slot (row m
    predicts the slot after the last draft). draft_probs[i] is the [V] float64
    distribution draft i was sampled from (None when greedy).
    """
    m = len(drafts)
    laws = [None if q is None else q[None] for q in draft_probs]  # [1, V] each: one candidate per position
    buffer = ProposalBuffer(0, TreeShape.chain(m), [-1, *drafts], list(range(m + 1)), laws, None, "chain", "")
    path, following = accept_tree(buffer, target_logits, chooser)
    return len(path), following

"""What each horizon's distribution says about drafting, row by row, read without a gradient.

For horizon k at row t (offset o_k), with p the next-token path's distribution at row t + o_k − 1 (the
row that predicts the same token, over the full vocabulary) and q_k the horizon's:

    own_hit[t]   the horizon's top-1 is its own training target: the label (`data`, and horizon 1
                 always), or the teacher's top-1 (a target with a teacher; within the draft vocabulary)
    accept[t]    α_k = Σ_v min(p(v), q_k(v)) = 1 − TV(p, q_k): the chance that speculative sampling at
                 T = 1 accepts horizon k's draft, given the drafts before it were accepted
    agree[t]     top-1 of q_k = top-1 of p: greedy decoding accepts the draft

Truncation at the first miss (`objective.truncate=first_miss`, Spec-AUF) keeps horizon k at row t only
while horizons 1..k−1 hit their own targets there; training-time acceptance (α_k, the greedy agreement
and τ = 1 + Σ_k Π_{j≤k} ᾱ_j, DeepSpec's estimate of tokens per forward) sums `accept` and `agree`.
Both need every horizon's V-wide logits: one projection per horizon, without a gradient, besides the
step's own (the training step reads them only on the steps it needs them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lab.horizon import Horizon
from lab.objective.backward import project


@dataclass
class HorizonReadings:
    own_hit: list[Tensor]  # per horizon [B, S-o_k] bool, False where the row is not supervised
    accept: list[Tensor] | None = None  # per horizon [B, S-o_k] float α_k (horizon 1: 1), 0 where not compared
    agree: list[Tensor] | None = None  # per horizon [B, S-o_k] bool greedy agreement (horizon 1: True)
    compared: list[Tensor] | None = None  # per horizon [B, S-o_k] bool: supervised, and the teacher row is valid

    def sums(self) -> Tensor:
        """[K, 3] float64: per horizon (Σ α, Σ agreement, rows compared)."""
        return torch.stack([torch.stack([a[c].double().sum(), g[c].double().sum(), c.double().sum()])
                            for a, g, c in zip(self.accept, self.agree, self.compared)])


def grid_logits(horizon: Horizon) -> Tensor:
    """[B, S-o, V or N] the horizon's logits on every row (supervised or not), no graph."""
    return project(horizon.hidden.detach(), horizon.norm, horizon.norm.weight.detach(), horizon.weight.detach())


@torch.no_grad()
def read_horizons(horizons: list[Horizon], with_acceptance: bool) -> HorizonReadings:
    """Own-target hits of every horizon; with `with_acceptance` also α_k and greedy agreement against p."""
    first = horizons[0]
    teacher_needed = with_acceptance or any(h.teacher is not None for h in horizons[1:]) or first.known is None
    log_p = F.log_softmax(grid_logits(first), dim=-1) if teacher_needed else None  # [B, S-1, V]
    if first.known is not None:
        own = [first.known.row_hit & first.mask]  # [B, S-1]: the hidden cache's hits (same top-1 as log_p's)
    else:
        own = [(log_p.argmax(-1) == first.labels) & first.mask]  # [B, S-1]
    # horizon 1 is the target itself: α = 1 and agreement on every supervised row
    readings = HorizonReadings(own, [first.mask.float()], [first.mask], [first.mask]) if with_acceptance else HorizonReadings(own)
    for horizon in horizons[1:]:
        read_one(horizon, first, log_p, readings)
    return readings


def read_one(horizon: Horizon, first: Horizon, log_p: Tensor | None, readings: HorizonReadings) -> None:
    o, rows = horizon.offset, horizon.hidden.shape[1]  # rows = S - o
    log_q = F.log_softmax(grid_logits(horizon), dim=-1)  # [B, S-o, V or N]
    choice = log_q.argmax(-1)  # [B, S-o]: an id, or an index in the draft vocabulary
    teacher = None if log_p is None else log_p[:, o - 1 : o - 1 + rows]  # [B, S-o, V]: next-token row t+o-1 predicts t+o
    if teacher is not None and horizon.vocab_ids is not None:
        teacher = teacher[..., horizon.vocab_ids]  # [B, S-o, N]: p on the draft ids (not renormalised: acceptance uses p itself)
    if horizon.teacher is None:
        target = horizon.labels  # [B, S-o]
    else:
        target = teacher.argmax(-1)  # [B, S-o]: the teacher's top-1 within the horizon's vocabulary
    readings.own_hit.append((choice == target) & horizon.mask)
    if readings.accept is None:
        return
    compared = horizon.mask & first.mask[:, o - 1 : o - 1 + rows]  # [B, S-o]
    alpha = torch.minimum(log_q, teacher).exp().sum(-1)  # [B, S-o]
    full_choice = choice if horizon.vocab_ids is None else horizon.vocab_ids[choice]  # [B, S-o] ids
    agree = full_choice == log_p[:, o - 1 : o - 1 + rows].argmax(-1)  # [B, S-o]
    readings.accept.append(torch.where(compared, alpha, torch.zeros_like(alpha)))
    readings.agree.append(agree & compared)
    readings.compared.append(compared)


def first_miss_masks(horizons: list[Horizon], own_hit: list[Tensor]) -> list[Tensor]:
    """[B, S-o_k] per horizon: its mask, kept only where horizons 1..k−1 hit their own targets at the same row."""
    masks, prefix = [horizons[0].mask], own_hit[0]  # [B, S-1]: horizon 1 is never truncated
    for k, horizon in enumerate(horizons[1:], start=1):
        rows = horizon.mask.shape[1]  # S - o_k
        masks.append(horizon.mask & prefix[:, :rows])  # [B, S-o_k]
        prefix = prefix[:, : own_hit[k].shape[1]] & own_hit[k]  # [B, S-o_k]: horizons 1..k all hit
    return masks


def prefix_hits(own_hit: list[Tensor], rows: int) -> Tensor:
    """[B, rows] every run horizon hit its own target at row t (what a skipped later horizon is truncated by)."""
    return torch.stack([hit[:, :rows] for hit in own_hit]).all(0)

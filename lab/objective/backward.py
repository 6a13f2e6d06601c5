"""Backward schedules: when the V-wide logits of each horizon live.

Each schedule turns the heads' d-wide rows and the reduction coefficients into (a) a
scalar *root* that the training loop hands to one `manual_backward`, and (b) detached
per-horizon statistics. Only that one backward touches module Parameters, so under DDP
gradients synchronise exactly once per step.

- joint: all horizons' logits built together; the root is the loss itself.
- sequential: per horizon, projection + cross-entropy run on detached leaves (the rows
  and the shared norm/projection weights) and are backpropagated at once, freeing the
  logits; the accumulated leaf gradients are then pushed through heads and trunk by a
  surrogate root  Σ_k <rows_k, g_k> + Σ_p <p, g_p>,  whose gradient is exactly g.
- chunked: sequential, with `F.linear_cross_entropy` so no full logits tensor exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn import LinearCrossEntropyOptions

from lab.errors import ConfigError, require_int
from lab.objective.targets import target_loss_sum, teacher_rows_of


@dataclass
class HorizonStats:
    loss_sums: torch.Tensor  # [K] detached: S_k, sum of token cross-entropies (local)
    counts: torch.Tensor  # [K] int64 local valid rows N_k, on the rows' device (CPU and CUDA alike)
    correct: torch.Tensor | None  # [K] top-1 hits, None when logits never exist (chunked)
    row_correct: list[torch.Tensor] | None = None  # per horizon [B, S-k] bool (evaluation only)
    row_argmax: list[torch.Tensor] | None = None  # per horizon [B, S-k] long top-1 id, -1 on unsupervised rows (evaluation only)


def supervised_rows(horizon) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather the valid rows of one horizon: ([N_k, d], [N_k])."""
    return horizon.hidden[horizon.mask], horizon.labels[horizon.mask]  # [N_k, d], [N_k]


def project(rows: torch.Tensor, norm, norm_weight: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[N, d] -> [N, V] logits through the final norm (`norm` with `norm_weight` in place) and the projection.

    The projection runs in the model's dtype; the logits come out at least float32, so a bf16 model's
    losses, log-probabilities and hits are float32 (float64 models stay float64)."""
    logits = F.linear(norm.normalize(rows, norm_weight), weight)  # [N, V]
    return logits.to(loss_dtype(logits.dtype))


def loss_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype losses are computed in: float32, or the model's own when it is wider (float64 exactness tests)."""
    return torch.promote_types(dtype, torch.float32)


def horizon_loss(rows, labels, horizon, norm_weight=None, weight=None):
    """Summed loss (cross-entropy, or the distilled target's) and top-1 hits of one horizon on given rows
    (optionally with leaf weights)."""
    norm_weight = horizon.norm.weight if norm_weight is None else norm_weight
    weight = horizon.weight if weight is None else weight
    logits = project(rows, horizon.norm, norm_weight, weight)  # [N_k, V]
    teacher_rows = None if horizon.teacher is None else teacher_rows_of(horizon)  # [N_k, d]
    loss_sum = target_loss_sum(logits, labels, horizon, teacher_rows)
    return loss_sum, top1_hits(logits.detach(), labels).sum()


def known_stats(horizon) -> tuple[torch.Tensor, torch.Tensor]:
    """(S_k, top-1 hits) of a horizon whose per-row loss and hits are known (`Horizon.known`): summed under its
    mask, no logits built. Such a horizon has no gradient path (its loss is constant), so it adds no root term."""
    mask = horizon.mask  # [B, S-k]
    return horizon.known.row_loss[mask].sum(), horizon.known.row_hit[mask].sum()  # [], []


def top1_hits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[N, V], [N] -> [N] bool: the label's logit is the maximum (ties count as hits).

    amax + gather is several times cheaper than argmax on CPU at large V.
    """
    label_logit = logits.gather(-1, labels[:, None]).squeeze(-1)  # [N]
    return label_logit >= logits.amax(-1)


class JointSchedule:
    name = "joint"
    reads: tuple[str, ...] = ()  # ScheduleConfig fields besides `name` it uses (others set are refused: lab/config/unused.py)

    def __init__(self, chunk_rows: int | None = None):
        pass  # only `chunked` uses chunk_rows; every schedule accepts the same config

    def run(self, horizons, coeffs: torch.Tensor) -> tuple[torch.Tensor, HorizonStats]:
        sums, hits, counts = [], [], []
        for horizon in horizons:
            if horizon.known is not None:
                loss_sum, correct = known_stats(horizon)
            else:
                rows, labels = supervised_rows(horizon)  # [N_k, d], [N_k]
                loss_sum, correct = horizon_loss(rows, labels, horizon)
            sums.append(loss_sum), hits.append(correct), counts.append(horizon.mask.sum())
        root = (coeffs.to(sums[0].dtype) * torch.stack(sums)).sum()
        return root, HorizonStats(torch.stack(sums).detach(), torch.stack(counts), torch.stack(hits))


class SequentialSchedule(JointSchedule):
    """Per-horizon projection + CE backpropagated at once to detached leaves."""

    name = "sequential"

    def horizon_sum(self, leaf_rows, labels, horizon, norm_leaf, weight_leaf):
        return horizon_loss(leaf_rows, labels, horizon, norm_leaf, weight_leaf)

    def run(self, horizons, coeffs: torch.Tensor) -> tuple[torch.Tensor, HorizonStats]:
        param_leaves: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(param) -> (param, detached leaf)

        def leaf_of(param):
            if id(param) not in param_leaves:
                param_leaves[id(param)] = (param, param.detach().requires_grad_(param.requires_grad))
            return param_leaves[id(param)][1]

        sums, hits, counts, row_terms = [], [], [], []
        for k, horizon in enumerate(horizons):
            if horizon.known is not None:
                loss_sum, correct = known_stats(horizon)
            else:
                rows, labels = supervised_rows(horizon)  # [N_k, d], [N_k]
                leaf_rows = rows.detach().requires_grad_(rows.requires_grad)  # [N_k, d] cut point
                loss_sum, correct = self.horizon_sum(leaf_rows, labels, horizon, leaf_of(horizon.norm.weight), leaf_of(horizon.weight))
                if loss_sum.requires_grad:
                    (coeffs[k].to(loss_sum.dtype) * loss_sum).backward()  # frees this horizon's logits now
                if leaf_rows.grad is not None:
                    row_terms.append((rows * leaf_rows.grad).sum())
            sums.append(loss_sum.detach()), hits.append(correct), counts.append(horizon.mask.sum())
        param_terms = [(param * leaf.grad).sum() for param, leaf in param_leaves.values() if leaf.grad is not None]
        root = sum(row_terms + param_terms, torch.zeros((), device=coeffs.device))
        correct = None if any(h is None for h in hits) else torch.stack(hits)
        return root, HorizonStats(torch.stack(sums), torch.stack(counts), correct)


class ChunkedSchedule(SequentialSchedule):
    """Sequential, with the projection + CE fused and chunked over rows by torch."""

    name = "chunked"
    reads = ("chunk_rows",)

    def __init__(self, chunk_rows: int | None = 1024):
        check_schedule(self.name, chunk_rows)
        self.chunk_rows = chunk_rows
        # An explicit chunk size: the 'auto' heuristic was measured far slower on CPU.
        self.options = LinearCrossEntropyOptions(batch_chunk_size=chunk_rows, chunking_method=None)

    def horizon_sum(self, leaf_rows, labels, horizon, norm_leaf, weight_leaf):
        wide = loss_dtype(leaf_rows.dtype)  # a bf16 model's fused projection + CE runs in float32 (its loss is float32)
        if labels.numel() == 0:
            return (leaf_rows.sum() + 0.0 * norm_leaf.sum() + 0.0 * weight_leaf.sum()).to(wide), None
        normed = horizon.norm.normalize(leaf_rows, norm_leaf).to(wide)  # [N_k, d]
        options = self.options if torch.is_grad_enabled() and leaf_rows.requires_grad else None
        return F.linear_cross_entropy(normed, weight_leaf.to(wide), labels, reduction="sum", options=options), None


BACKWARD_SCHEDULES = {"joint": JointSchedule, "sequential": SequentialSchedule, "chunked": ChunkedSchedule}


def check_schedule(name: str, chunk_rows: int | None) -> None:
    """The `schedule` group's one check: a known name, and `chunk_rows` an integer ≥ 1 where it is used."""
    if name not in BACKWARD_SCHEDULES:
        raise ConfigError("schedule.name", f"unknown '{name}'; allowed: {', '.join(BACKWARD_SCHEDULES)}")
    if name == "chunked":
        require_int(chunk_rows, "schedule.chunk_rows", least=1)


def build_backward_schedule(name: str, chunk_rows: int | None = None):
    check_schedule(name, chunk_rows)
    return BACKWARD_SCHEDULES[name](chunk_rows=chunk_rows)


@torch.no_grad()
def evaluate_horizons(horizons) -> HorizonStats:
    """Validation statistics, one horizon's logits alive at a time, with per-row correctness."""
    sums, hits, counts, row_correct, row_argmax = [], [], [], [], []
    for horizon in horizons:
        rows, labels = supervised_rows(horizon)  # [N_k, d], [N_k]
        logits = project(rows, horizon.norm, horizon.norm.weight, horizon.weight)  # [N_k, V]
        hit = top1_hits(logits, labels)  # [N_k]
        grid = torch.zeros_like(horizon.mask)  # [B, S-k]
        grid[horizon.mask] = hit
        choice = torch.full_like(horizon.labels, -1)  # [B, S-k]
        argmax = logits.argmax(-1)  # [N_k]: an id, or an index in the draft vocabulary
        choice[horizon.mask] = argmax if horizon.vocab_ids is None else horizon.vocab_ids[argmax]
        row_argmax.append(choice)
        sums.append(F.cross_entropy(logits, labels, reduction="sum")), hits.append(hit.sum()), counts.append(horizon.mask.sum())
        row_correct.append(grid)
    return HorizonStats(torch.stack(sums), torch.stack(counts), torch.stack(hits), row_correct, row_argmax)

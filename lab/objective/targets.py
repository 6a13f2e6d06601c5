"""Training targets of horizons k ≥ 2: the data label, or a divergence from the next-token path's own distribution.

Every target but `data` has a teacher: horizon k at row t is compared with the next-token path's
distribution p at row t + o_k − 1, the row that predicts the same token tokens[t + o_k], taken
detached (no gradient reaches the path that makes it). With q_k the horizon's distribution and
α = Σ_v min(p(v), q_k(v)) = 1 − TV(p, q_k) (the chance that speculative sampling at T = 1 accepts
the draft), the per-row loss is

    ce_weight · CE(label) + divergence_weight · D(p, q_k)

    target     ce_weight     D                                   divergence_weight
    data       1             —                                   0
    distill    0             KL(p ‖ q_k)                         1            (FastMTP / MTP-D self-distillation)
    mix        1 − a         KL(p ‖ q_k)                         a            (a = objective.mix_alpha)
    tv         c             1 − α                               1 − c        (c = objective.ce_share; DSpark: c = 0.1)
    lk         c             −log α                              1 − c        (LK, arXiv 2602.23881)
    lk_hybrid  c             λ·KL(p ‖ q_k) + (1 − λ)·(1 − α)     1 − c        (λ = exp(−η·α) detached, η = objective.lk_eta)

`tv` and `lk` optimise acceptance itself: TV's gradient on row t is that of −α; `lk`'s is the same
divided by α, so rows the head rarely gets accepted on are not drowned out (α is clamped at 1e-6
below, where the log would blow up). `lk_hybrid` is our reading of LK's hybrid: KL's strong
gradients while the draft is far from the teacher (λ near 1 at α ≈ 0), acceptance once it is close
(λ = e^−3 ≈ 0.05 at α = 1); λ is per row and carries no gradient.

Rows are summed like the cross-entropy, so every reduction policy, λ schedule and backward schedule
(but `chunked`, which never builds logits) applies unchanged. A row is supervised when its data
label is valid and the teacher row is a valid next-token row too. Horizon 1 always learns the data.
Under a draft vocabulary (`head.draft_vocab`) the teacher's distribution is restricted to the
horizon's N ids and renormalised over them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lab.errors import ConfigError, is_number, require, require_bool
from lab.horizon import Horizon, Teacher

ALPHA_FLOOR = 1e-6  # lk: −log α is taken of max(α, ALPHA_FLOOR)


def row_kl(log_q: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """[N, V] student and teacher log-probabilities -> [N] KL(p ‖ q)."""
    return F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(-1)


def row_acceptance(log_q: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """[N, V], [N, V] -> [N] α = Σ_v min(p, q): speculative sampling's acceptance of a draft from q under target p."""
    return torch.minimum(log_q, log_p).exp().sum(-1)


# D(p, q_k) per row from (student log q [N, V], teacher log p [N, V], η) -> [N]
DIVERGENCES: dict[str, Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]] = {
    "kl": lambda log_q, log_p, eta: row_kl(log_q, log_p),
    "tv": lambda log_q, log_p, eta: 1.0 - row_acceptance(log_q, log_p),
    "lk": lambda log_q, log_p, eta: -row_acceptance(log_q, log_p).clamp_min(ALPHA_FLOOR).log(),
    "lk_hybrid": lambda log_q, log_p, eta: hybrid(row_acceptance(log_q, log_p), row_kl(log_q, log_p), eta),
}


def hybrid(alpha: torch.Tensor, kl: torch.Tensor, eta: float) -> torch.Tensor:
    """[N] λ·KL + (1 − λ)·(1 − α) with λ = exp(−η·α) per row, detached."""
    weight = torch.exp(-eta * alpha.detach())  # [N]
    return weight * kl + (1.0 - weight) * (1.0 - alpha)


# target → (ce_weight, divergence, divergence_weight) from (mix_alpha, ce_share)
TARGETS: dict[str, Callable[[float, float], tuple[float, str | None, float]]] = {
    "data": lambda a, c: (1.0, None, 0.0),
    "distill": lambda a, c: (0.0, "kl", 1.0),
    "mix": lambda a, c: (1.0 - a, "kl", a),
    "tv": lambda a, c: (c, "tv", 1.0 - c),
    "lk": lambda a, c: (c, "lk", 1.0 - c),
    "lk_hybrid": lambda a, c: (c, "lk_hybrid", 1.0 - c),
}
CE_SHARE_TARGETS = ("tv", "lk", "lk_hybrid")  # the targets `objective.ce_share` mixes the data label into
TRUNCATIONS = ("none", "first_miss")  # objective.truncate (lab/objective/readings.py)


@dataclass(frozen=True)
class TargetConfig:
    target: str = "data"
    mix_alpha: float = 0.5  # `mix` only: the distilled distribution's share
    ce_share: float = 0.0  # tv, lk, lk_hybrid: the data label's share of the per-row loss (DSpark: 0.1)
    lk_eta: float = 3.0  # lk_hybrid: λ = exp(−η·α)
    truncate: str = "none"  # first_miss: horizon k at row t only while horizons 1..k−1 hit their own targets there
    # Inputs, not targets: answers replaced by a dummy in the inputs (lab/data/synthetic/teacherless.py);
    # the data module builds that view, the objective only carries the switch with the rest of the group.
    teacherless: bool = False

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ConfigError("objective.target", f"unknown '{self.target}'; allowed: {', '.join(TARGETS)}")
        for name, low, high in (("mix_alpha", 0, 1), ("ce_share", 0, 1), ("lk_eta", 0, math.inf)):
            value = getattr(self, name)
            require(is_number(value) and low <= value <= high, f"objective.{name}", f"must be a number in [{low}, {high}], got {value!r}")
        require(self.ce_share == 0 or self.target in CE_SHARE_TARGETS, "objective.ce_share",
                f"mixes the data label into {', '.join(CE_SHARE_TARGETS)}; target={self.target} has its own "
                "(data: all; distill: none; mix: objective.mix_alpha)")
        require(self.ce_share < 1 or self.target not in CE_SHARE_TARGETS, "objective.ce_share",
                f"1 leaves no {self.target} term; use target=data")
        require(self.truncate in TRUNCATIONS, "objective.truncate", f"unknown {self.truncate!r}; allowed: {', '.join(TRUNCATIONS)}")
        require_bool(self.teacherless, "objective.teacherless")

    @property
    def rule(self) -> tuple[float, str | None, float]:
        return TARGETS[self.target](self.mix_alpha, self.ce_share)

    @property
    def distills(self) -> bool:
        """The target has a teacher (a divergence from the next-token path's distribution)."""
        return self.rule[2] > 0


def attach_teachers(horizons: list[Horizon], cfg: TargetConfig) -> list[Horizon]:
    """Horizons ≥ 2 with their detached teacher rows (and the rows both targets cover); horizon 1 unchanged."""
    if not cfg.distills:
        return horizons
    ce_weight, divergence, divergence_weight = cfg.rule
    first = horizons[0]
    out = [first]
    for horizon in horizons[1:]:
        o, rows = horizon.offset, horizon.hidden.shape[1]  # rows = S - o
        teacher_rows = first.hidden[:, o - 1 : o - 1 + rows].detach()  # [B, S-o, d]: next-token row t+o-1 predicts t+o
        weight = first.weight.detach()  # [V, d]
        if horizon.vocab_ids is not None:  # a draft vocabulary: the teacher over the same N ids, renormalised there
            weight = weight[horizon.vocab_ids]  # [N, d]
        teacher = Teacher(teacher_rows, first.norm.weight.detach(), first.norm, weight, ce_weight, divergence, divergence_weight, cfg.lk_eta)
        out.append(dataclasses.replace(horizon, mask=supervised_mask(horizon.mask, first.mask, o, cfg), teacher=teacher))
    return out


def supervised_mask(mask: torch.Tensor, first_mask: torch.Tensor, offset: int, cfg: TargetConfig) -> torch.Tensor:
    """[B, S-o] rows of an offset-o horizon the target supervises: the data rule, and for a distilled
    target also a valid next-token row t+o-1 (the teacher)."""
    if not cfg.distills or offset == 1:
        return mask
    return mask & first_mask[:, offset - 1 : offset - 1 + mask.shape[1]]  # [B, S-o]


def teacher_rows_of(horizon: Horizon) -> torch.Tensor:
    """[N_k, d] the teacher rows of the horizon's supervised rows (same order as `supervised_rows`)."""
    return horizon.teacher.rows[horizon.mask]


@torch.no_grad()
def teacher_log_probs(teacher: Teacher, rows: torch.Tensor) -> torch.Tensor:
    """[N, d] teacher rows -> [N, V] log-probabilities of the next-token path (no graph)."""
    normed = teacher.norm.normalize(rows, teacher.norm_weight)  # [N, d]
    return F.log_softmax(F.linear(normed, teacher.weight).float(), dim=-1)  # [N, V]


def target_loss_sum(logits: torch.Tensor, labels: torch.Tensor, horizon: Horizon, teacher_rows: torch.Tensor | None) -> torch.Tensor:
    """The horizon's summed per-row loss on [N, V] logits: CE, or the target's mix of CE and its divergence."""
    if horizon.teacher is None:
        return F.cross_entropy(logits, labels, reduction="sum")
    teacher = horizon.teacher
    total = torch.zeros((), dtype=logits.dtype, device=logits.device)
    if teacher.ce_weight:
        total = total + teacher.ce_weight * F.cross_entropy(logits, labels, reduction="sum")
    log_p = teacher_log_probs(teacher, teacher_rows).to(logits.dtype)  # [N, V]
    divergence = DIVERGENCES[teacher.divergence](F.log_softmax(logits, dim=-1), log_p, teacher.eta)  # [N]
    return total + teacher.divergence_weight * divergence.sum()

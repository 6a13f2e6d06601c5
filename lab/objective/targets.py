"""Training targets of horizons k ≥ 2: the data label, the next-token path's own distribution, or a mix.

`objective.target=distill` (FastMTP / MTP-D style self-distillation): horizon k at row t is
trained towards the next-token path's distribution at row t + o_k − 1, the row that predicts
the same token tokens[t + o_k], taken detached (no gradient reaches the path that makes it):

    per-row loss = ce_weight · CE(label) + kl_weight · KL(p_teacher ‖ q_k)

with (ce_weight, kl_weight) = (1, 0) for `data`, (0, 1) for `distill`, (1 − α, α) for `mix`
(α = `mix_alpha`). Rows are summed like the cross-entropy, so every reduction policy applies
unchanged. A row is supervised when its data label is valid and the teacher row is a valid
next-token row too. Horizon 1 always learns the data. Under a draft vocabulary (`head.draft_vocab`)
the teacher's distribution is restricted to the horizon's N ids and renormalised over them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lab.errors import ConfigError, require
from lab.model.heads import Horizon, Teacher

# target → (ce_weight, kl_weight) as a function of mix_alpha
TARGETS = {
    "data": lambda alpha: (1.0, 0.0),
    "distill": lambda alpha: (0.0, 1.0),
    "mix": lambda alpha: (1.0 - alpha, alpha),
}


@dataclass(frozen=True)
class TargetConfig:
    target: str = "data"
    mix_alpha: float = 0.5  # `mix` only: the distilled distribution's share
    # Inputs, not targets: answers replaced by a dummy in the inputs (lab/data/synthetic/teacherless.py);
    # the data module builds that view, the objective only carries the switch with the rest of the group.
    teacherless: bool = False

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ConfigError("objective.target", f"unknown '{self.target}'; allowed: {', '.join(TARGETS)}")
        alpha = self.mix_alpha
        require(isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and math.isfinite(alpha) and 0 <= alpha <= 1,
                "objective.mix_alpha", f"must be a number in [0, 1], got {alpha!r}")
        require(isinstance(self.teacherless, bool), "objective.teacherless", f"must be true or false, got {self.teacherless!r}")

    @property
    def distills(self) -> bool:
        return TARGETS[self.target](self.mix_alpha)[1] > 0


def attach_teachers(horizons: list[Horizon], cfg: TargetConfig) -> list[Horizon]:
    """Horizons ≥ 2 with their detached teacher rows (and the rows both targets cover); horizon 1 unchanged."""
    if not cfg.distills:
        return horizons
    ce_weight, kl_weight = TARGETS[cfg.target](cfg.mix_alpha)
    first = horizons[0]
    out = [first]
    for horizon in horizons[1:]:
        o, rows = horizon.offset, horizon.hidden.shape[1]  # rows = S - o
        teacher_rows = first.hidden[:, o - 1 : o - 1 + rows].detach()  # [B, S-o, d]: next-token row t+o-1 predicts t+o
        weight = first.weight.detach()  # [V, d]
        if horizon.vocab_ids is not None:  # a draft vocabulary: the teacher over the same N ids, renormalised there
            weight = weight[horizon.vocab_ids]  # [N, d]
        teacher = Teacher(teacher_rows, first.norm.weight.detach(), first.norm, weight, ce_weight, kl_weight)
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


def kl_sum(logits: torch.Tensor, teacher_log_p: torch.Tensor) -> torch.Tensor:
    """Σ_rows KL(p ‖ q): [N, V] student logits, [N, V] detached teacher log-probabilities."""
    return F.kl_div(F.log_softmax(logits, dim=-1), teacher_log_p.to(logits.dtype), reduction="sum", log_target=True)


def target_loss_sum(logits: torch.Tensor, labels: torch.Tensor, horizon: Horizon, teacher_rows: torch.Tensor | None) -> torch.Tensor:
    """The horizon's summed per-row loss on [N, V] logits: CE, or the teacher's mix of CE and KL."""
    if horizon.teacher is None:
        return F.cross_entropy(logits, labels, reduction="sum")
    teacher = horizon.teacher
    total = torch.zeros((), dtype=logits.dtype, device=logits.device)
    if teacher.ce_weight:
        total = total + teacher.ce_weight * F.cross_entropy(logits, labels, reduction="sum")
    return total + teacher.kl_weight * kl_sum(logits, teacher_log_probs(teacher, teacher_rows))

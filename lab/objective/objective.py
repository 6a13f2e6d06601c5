"""The objective of one run: reduction policy, count scope, λ schedule and backward schedule.

Built once from the `reduction`, `weights` and `schedule` config groups (every check runs
here, at build time); the training step then asks it for the step's coefficients and for
the loss it logs, with no further checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from lab.objective.distributed import all_reduce_sum, world_size
from lab.errors import ConfigError, require
from lab.schema import typed
from lab.objective.backward import build_backward_schedule, check_schedule
from lab.objective.readings import HorizonReadings, first_miss_masks, prefix_hits, read_horizons
from lab.objective.reductions import POLICIES, effective_weights, validate_reduction
from lab.objective.targets import TargetConfig, attach_teachers, supervised_mask
from lab.objective.weights import Progress, WeightSchedule, build_weight_schedule

COUNT_SCOPES = ("global", "local")


@dataclass(frozen=True)
class ReductionConfig:
    policy: str = "head_mean"
    count_scope: str = "global"  # global: exact under DDP; local: each rank normalises by its own counts
    fixed_denominator: float | None = None  # None: token positions in the (global) batch

    def __post_init__(self) -> None:
        validate_reduction(self.policy, self.fixed_denominator, resolved=False)
        if self.count_scope not in COUNT_SCOPES:
            raise ConfigError("reduction.count_scope", f"unknown '{self.count_scope}'; allowed: {', '.join(COUNT_SCOPES)}")


@dataclass(frozen=True)
class ScheduleConfig:
    name: str = "sequential"
    chunk_rows: int | None = None  # rows per F.linear_cross_entropy chunk (`chunked` only)

    def __post_init__(self) -> None:
        check_schedule(self.name, self.chunk_rows)


@dataclass(frozen=True)
class StepCoefficients:
    """The reduction's coefficients for one step, and what they were computed from."""

    coefficients: Tensor  # [K] float64 c_k
    counts: Tensor  # [K] float64 N_k: summed over ranks (count_scope=global) or this rank's (local)
    lambdas: Tensor  # [K] float64 λ_k
    scale: int  # world size under global counts (DDP averages gradients over ranks), else 1

    @property
    def applied(self) -> Tensor:
        """[K] float32: what this rank's backward multiplies each S_k by."""
        return (self.coefficients * self.scale).to(torch.float32)

    @property
    def effective_weights(self) -> Tensor:
        return effective_weights(self.coefficients, self.counts)

    def loss_shares(self, local_counts: Tensor) -> Tensor:
        """[K] share of the optimised loss per horizon over all ranks: Σ_r c_k^r N_k^r / Σ_r Σ_j c_j^r N_j^r.

        With global counts every rank has the same c_k and this is `effective_weights`; with local
        counts each rank weighs its own rows with its own coefficients.
        """
        mass = all_reduce_sum(self.coefficients * local_counts.to(self.coefficients))  # [K]
        return effective_weights(mass, torch.ones_like(mass))


class Objective:
    def __init__(self, reduction: ReductionConfig, schedule: ScheduleConfig, weight_schedule: WeightSchedule,
                 target: TargetConfig | None = None):
        self.reduction, self.schedule = reduction, schedule
        self.weight_schedule = weight_schedule
        self.target = target or TargetConfig()
        # F.linear_cross_entropy takes hard labels only: a distilled target needs the logits.
        require(not (self.target.distills and schedule.name == "chunked"), "objective.target",
                f"'{self.target.target}' needs the logits, which schedule=chunked never builds; allowed with chunked: data "
                "(or use schedule=sequential)")
        self.backward_schedule = build_backward_schedule(schedule.name, schedule.chunk_rows)
        self._policy = POLICIES[reduction.policy]

    @classmethod
    def build(cls, reduction: Mapping, weights: Mapping, schedule: Mapping, k: int, objective: Mapping | None = None) -> Objective:
        """From the config groups' mappings (and the `objective` node: targets), for K horizons; every check runs here."""
        options = {key: value for key, value in weights.items() if key != "name"}
        target = typed(TargetConfig, objective or {}, "objective")
        require(target.truncate == "none" or k > 1, "objective.truncate",
                f"{target.truncate} truncates horizons 2..K after a miss; K=1 has none (allowed with K=1: none)")
        return cls(typed(ReductionConfig, reduction, "reduction"), typed(ScheduleConfig, schedule, "schedule"),
                   build_weight_schedule(weights["name"], k, **options), target)

    @property
    def truncates(self) -> bool:
        return self.target.truncate == "first_miss"

    def readings(self, horizons, with_acceptance: bool) -> HorizonReadings | None:
        """Row readings of the horizons (own-target hits; α and agreement `with_acceptance`); None when nothing needs them."""
        if not (self.truncates or with_acceptance):
            return None
        return read_horizons(horizons, with_acceptance)

    def truncated(self, horizons, readings: HorizonReadings | None):
        """The horizons with `objective.truncate` applied to their masks (the counts every reduction divides by follow)."""
        if not self.truncates:
            return horizons
        return [replace(h, mask=mask) for h, mask in zip(horizons, first_miss_masks(horizons, readings.own_hit))]

    def live_horizons(self, progress: Progress) -> int:
        """Horizons 1..n the step must run; the rest have λ = 0 for the rest of training."""
        return self.weight_schedule.live_horizons(progress)

    def training_targets(self, horizons):
        """The horizons as the training loss sees them (distilled targets attached when configured)."""
        return attach_teachers(horizons, self.target)

    def skipped_masks(self, head, batch: dict, horizons, draft_ids: Tensor | None = None,
                      readings: HorizonReadings | None = None) -> list[Tensor]:
        """[B, S-o_k] supervised rows of the horizons after the ones run (skipped), from the labels alone, so
        every reduction policy sees the counts of a full step; under a draft vocabulary (`draft_ids` [N]) only
        the rows whose target is in it, as a run horizon counts them. Under truncation, only the rows where every
        run horizon hit (the skipped horizons' own hits are never computed: their λ is 0 for good)."""
        masks = []
        for k in range(len(horizons) + 1, head.k + 1):
            offset = head.offsets[k - 1]
            mask = supervised_mask(head.validity_mask(k, batch), horizons[0].mask, offset, self.target)  # [B, S-o]
            if draft_ids is not None:
                mask = mask & torch.isin(batch["tokens"][:, offset:], draft_ids)  # [B, S-o]: targets tokens[t+o] in the set
            if self.truncates:
                mask = mask & prefix_hits(readings.own_hit, mask.shape[1])  # [B, S-o]
            masks.append(mask)
        return masks

    @property
    def global_counts(self) -> bool:
        return self.reduction.count_scope == "global"

    def coefficients(self, local_counts: Tensor, positions: int, progress: Progress) -> StepCoefficients:
        """c_k from the counts of the configured scope; `positions` = token positions in this rank's batch."""
        lambdas = self.weight_schedule.lambdas(progress)  # [K] float64
        world = world_size() if self.global_counts else 1
        counts = all_reduce_sum(local_counts) if self.global_counts else local_counts  # [K]
        fixed = self.reduction.fixed_denominator
        denominator = float(fixed if fixed is not None else positions * world)
        coeffs = self._policy(counts.to(torch.float64), lambdas.to(counts.device, torch.float64), denominator)
        return StepCoefficients(coeffs, counts, lambdas, world)

    def loss(self, local_sums: Tensor, step: StepCoefficients) -> tuple[Tensor, Tensor]:
        """(the objective this step optimises, over all ranks; S_k summed over ranks), both float64."""
        global_sums = all_reduce_sum(local_sums.to(torch.float64))  # [K]
        if self.global_counts:
            return (step.coefficients * global_sums).sum(), global_sums
        # Each rank normalised by its own counts; DDP averages the ranks' gradients.
        local = (step.coefficients * local_sums.to(torch.float64)).sum()
        return all_reduce_sum(local) / world_size(), global_sums

"""One training step, read top to bottom: forward, coefficients, probes, logits, loss check, update.

`train_step` is the only implementation of the step: the LightningModule calls it with
Lightning's backward and optimizer (`MTPLitModule.training_step`), the plain-PyTorch
benchmark loop with torch's (`PlainOptimization`), so the two differ only in the harness.
It returns a typed `StepOutputs` that callbacks read by attribute.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from lab.objective.distributed import all_reduce_sum
from lab.horizon import Horizon
from lab.objective.backward import loss_dtype
from lab.training.master_weights import gather_master_grads
from lab.objective.logit_bytes import logit_bytes
from lab.objective.memory import SavedTensorMeter
from lab.objective.objective import Objective, ScheduleConfig
from lab.objective.weights import Progress
from lab.training.router_balance import RouterBalance


class StepProbe(Protocol):
    """Reads the step's forward graph between the forward and the first backward (GradDiagnostics).

    Must not write `.grad`, draw random numbers or change the graph: the step continues on it.
    `step_coeffs` [K] float32 are the coefficients this rank's backward applies.
    """

    def __call__(self, batch: dict, horizons: list[Horizon], step_coeffs: Tensor) -> None: ...


class Optimization(Protocol):
    """How a loop applies gradients: Lightning's (manual_backward, clip_gradients, LightningOptimizer) or torch's."""

    def zero_grad(self) -> None: ...
    def backward(self, root: Tensor) -> None: ...
    def update(self) -> None: ...  # clip, optimizer step, LR scheduler step


class PlainOptimization:
    """Plain PyTorch: `root.backward()`, `clip_grad_norm_`, optimizer and LR scheduler steps."""

    def __init__(self, model: torch.nn.Module, optimizer, scheduler, grad_clip: float | None):
        self.model, self.optimizer, self.scheduler, self.grad_clip = model, optimizer, scheduler, grad_clip

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, root: Tensor) -> None:
        root.backward()

    def update(self) -> None:
        gather_master_grads(self.optimizer)  # bf16 Parameters: clip the float32 masters' grads
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_([p for group in self.optimizer.param_groups for p in group["params"]], self.grad_clip)
        self.optimizer.step()
        self.scheduler.step()


@dataclass
class StepOutputs:
    """Per-step statistics (detached tensors on the model's device: nothing here waits for them).

    Sums and hits are over all ranks; see `counts` for the count scope. Callbacks turn them into
    numbers only on the steps they log.
    """

    loss: Tensor  # [] float64: the objective the step optimised (Σ_k c_k S_k, over ranks); logged as train/objective
    loss_sums: Tensor  # [K] float64 S_k summed over ranks (0 for a skipped horizon)
    counts: Tensor  # [K] float64 N_k over ranks (whatever the count scope: per-horizon metrics divide the sums by these)
    local_counts: Tensor  # [K] this rank's rows with logits: N_k, 0 for a skipped horizon
    correct: Tensor | None  # [K] float64 top-1 hits over ranks; None when no logits exist (chunked)
    coefficients: Tensor  # [K] float64 c_k
    lambdas: Tensor  # [K] float64 λ_k
    effective_weights: Tensor  # [K] share of the loss per horizon over ranks: Σ_r c_k^r N_k^r / Σ_r Σ_j c_j^r N_j^r
    tokens: int  # active tokens over ranks (the weight schedule's position advances by this)
    saved_peak_bytes: int | None  # measured peak of tensors saved for backward; None when not measured
    schedule: ScheduleConfig  # the backward schedule, vocabulary size and logit element size: for logits_live_bytes
    vocab_size: int
    logit_element_bytes: int
    active_horizons: int = 0  # horizons 1..n this step ran (the rest had λ = 0 for good and were skipped); 0: all K
    router_loss: Tensor | None = None  # [] α·Σ f_i P_i added to the step's loss (model.router.balance_loss_alpha); None: off
    draft_coverage: Tensor | None = None  # [K-1, 2] float64 over ranks, horizons 2..: (targets in the draft vocabulary, all); None: full vocabulary
    acceptance: Tensor | None = None  # [n, 3] float64 over ranks, run horizons: (Σ α_k, Σ greedy agreement, rows compared); None: not read
    truncation: Tensor | None = None  # [n, 2] float64 over ranks, run horizons: (rows kept, rows supervised before); None: no truncation

    @property
    def logits_live_bytes(self) -> int:
        """Logical peak of live V-wide logits under the backward schedule (this rank's counts); computed when asked."""
        return logit_bytes(self.local_counts, self.vocab_size, schedule=self.schedule.name,
                           bytes_per_element=self.logit_element_bytes, chunk_rows=self.schedule.chunk_rows)


def step_outputs(outputs) -> StepOutputs | None:
    """The StepOutputs inside what Lightning hands `on_train_batch_end` (None when there is none)."""
    return None if outputs is None else outputs.get("step")


def local_counts(horizons: Sequence[Horizon], skipped: Sequence[Tensor] = ()) -> Tensor:
    """[K] float64 valid rows per horizon on this rank; `skipped`: the masks of horizons the forward skipped."""
    return torch.stack([m.sum() for m in [*(h.mask for h in horizons), *skipped]]).to(torch.float64)  # [K]


def padded(values: Tensor, k: int) -> Tensor:
    """[n] -> [K]: zeros for the horizons a step skipped."""
    return torch.cat([values, values.new_zeros(k - values.numel())])  # [K]


def touch_every_parameter(model: torch.nn.Module, like: Tensor) -> Tensor:
    """0 · Σ p over trainable Parameters (a [] tensor like `like`): skipped horizons' weights get a zero
    gradient, as a λ = 0 step gives them (same optimizer update, and DDP sees every Parameter used)."""
    return sum((p.sum().to(like) * 0.0 for p in model.parameters() if p.requires_grad), like.new_zeros(()))


def train_step(
    model: torch.nn.Module,
    objective: Objective,
    batch: dict,
    progress: Progress,
    optimization: Optimization,
    *,
    probes: Sequence[StepProbe] = (),
    measure_memory: bool = False,
    measure_acceptance: bool = False,
    router_balance: RouterBalance | None = None,
) -> StepOutputs:
    """One optimizer step on `batch`; `measure_memory` turns the saved-tensor meter on for this step;
    `measure_acceptance` reads each horizon's expected acceptance and greedy agreement (no gradient);
    `router_balance` (model.router on an MoE model) adds the balance loss and moves the routers' biases."""
    optimization.zero_grad()
    meter = SavedTensorMeter(exclude=model.parameters()) if measure_memory else contextlib.nullcontext()
    head = model.head
    # Horizons whose λ is 0 for the rest of training are skipped (blocks, projection, loss); probes
    # (gradient diagnostics) measure every horizon, so a step with probes runs them all.
    live = head.k if probes else objective.live_horizons(progress)
    recording = router_balance.recording() if router_balance is not None else contextlib.nullcontext()
    with meter, recording:
        # 1. Forward: one Horizon (d-wide rows, labels, mask, projection) per predicted offset, horizons 1..live.
        horizons = objective.training_targets(model(batch, live))
        #    Row readings without a gradient (own-target hits, α, agreement), then truncation at the first miss.
        readings = objective.readings(horizons, measure_acceptance)
        supervised = local_counts(horizons)  # [live] before truncation
        horizons = objective.truncated(horizons, readings)
        # 2. Coefficients c_k from the valid counts (all-reduced for count_scope=global) and λ(progress).
        # [K] this rank's valid rows; a skipped horizon's come from its labels (Objective.skipped_masks)
        rank_counts = local_counts(horizons, objective.skipped_masks(head, batch, horizons, getattr(model, "draft_ids", None), readings))
        coeffs = objective.coefficients(rank_counts, batch["tokens"].numel(), progress)
        applied = coeffs.applied  # [K] float32: what this rank's backward multiplies each S_k by
        # 3. Probes read this step's graph before any backward; the meter does not count them.
        if probes:
            with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                for probe in probes:
                    probe(batch, horizons, applied)
        # 4. Backward schedule: V-wide logits and cross-entropy per horizon; `root` carries the gradient to the Parameters.
        root, stats = objective.backward_schedule.run(horizons, applied[:live])  # stats: [live] per horizon
        if live < head.k:
            root = root + touch_every_parameter(model, root)
        router_loss = router_balance.loss(batch) if router_balance is not None else None
        if router_loss is not None:
            root = root + router_loss.to(root)  # the balance loss trains the routers alongside the objective
        # 5. The loss over ranks; a non-finite one stops the run before any Parameter gradient exists.
        #    The step's one host sync: the finiteness check and the token count in one transfer.
        loss, global_sums = objective.loss(padded(stats.loss_sums, head.k), coeffs)
        tokens = all_reduce_sum(batch["active"].sum())  # [] active tokens over ranks
        loss_value, token_count = torch.stack([loss, tokens.to(loss)]).tolist()  # float64: exact below 2^53 tokens
        if not math.isfinite(loss_value):
            # `progress.step` = the step metrics.csv logs this batch under (the update count before it).
            raise FloatingPointError(f"non-finite loss at step {progress.step} ({loss_value}); the update was not applied")
        # 6. One backward through heads and trunk (under DDP the only one that synchronises).
        optimization.backward(root)
    # 7. Clip, optimizer step, LR schedule step.
    optimization.update()
    if router_balance is not None:
        router_balance.update_bias(batch)  # 8. the selection biases move by ±γ from this step's loads
    return StepOutputs(
        loss=loss.detach(),
        loss_sums=global_sums,
        counts=coeffs.counts if objective.global_counts else all_reduce_sum(rank_counts),
        local_counts=padded(stats.counts, head.k),
        correct=None if stats.correct is None else all_reduce_sum(padded(stats.correct.to(torch.float64), head.k)),
        coefficients=coeffs.coefficients,
        lambdas=coeffs.lambdas,
        effective_weights=coeffs.loss_shares(rank_counts),
        tokens=int(token_count),
        saved_peak_bytes=meter.peak_bytes if measure_memory else None,
        schedule=objective.schedule,
        vocab_size=horizons[0].weight.shape[0],
        logit_element_bytes=torch.finfo(loss_dtype(horizons[0].hidden.dtype)).bits // 8,  # logits are float32 or wider
        active_horizons=live,
        router_loss=None if router_loss is None else router_loss.detach(),
        draft_coverage=draft_coverage(horizons),
        acceptance=None if readings is None or readings.accept is None else all_reduce_sum(readings.sums()),
        truncation=all_reduce_sum(torch.stack([local_counts(horizons), supervised], dim=1)) if objective.truncates else None,
    )


def draft_coverage(horizons: Sequence[Horizon]) -> Tensor | None:
    """[n-1, 2] float64 over ranks: per run horizon ≥ 2, (targets the draft vocabulary covers, supervised targets)."""
    parts = [h.draft_coverage for h in horizons[1:] if h.draft_coverage is not None]
    return all_reduce_sum(torch.stack(parts).to(torch.float64)) if parts else None

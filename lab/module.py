"""The LightningModule: wires model, reduction, weight schedule and backward schedule.

Manual optimisation throughout, so every backward schedule shares one code path and
exactly one `manual_backward` per step touches module Parameters (one DDP sync).
Metrics logic lives in callbacks; this module returns per-step statistics for them.
"""

from __future__ import annotations

import math
from dataclasses import fields

import pytorch_lightning as pl
import torch
import torch.distributed as dist

from lab.checkpoint import (
    build_manifest,
    collect_rng_states,
    restore_rng_states,
    tokenizer_payload,
    verify_restored,
)
from lab.errors import ConfigError
from lab.model.heads import HeadConfig
from lab.model.mtp import MTPModel
from lab.model.trunk import ModelConfig
from lab.objective import (
    Progress,
    build_backward_schedule,
    build_weight_schedule,
    coefficients,
    effective_weights,
    evaluate_horizons,
    logit_bytes,
    validate_reduction,
)
from lab.objective.memory import SavedTensorMeter

COUNT_SCOPES = ("global", "local")


def dataclass_from(cls, values: dict, field_prefix: str):
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"{field_prefix}.{unknown[0]}", f"unknown option; allowed: {', '.join(sorted(known))}")
    return cls(**values)


class MTPLitModule(pl.LightningModule):
    def __init__(self, model: dict, head: dict, reduction: dict, weights: dict, schedule: dict, optim: dict, total_steps: int):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.model = MTPModel(dataclass_from(ModelConfig, model, "model"), dataclass_from(HeadConfig, head, "head"))
        self.policy = reduction["policy"]
        self.count_scope = reduction.get("count_scope", "global")
        self.fixed_denominator = reduction.get("fixed_denominator")
        validate_reduction(self.policy, self.fixed_denominator if self.fixed_denominator is not None else 1)
        if self.count_scope not in COUNT_SCOPES:
            raise ConfigError("reduction.count_scope", f"unknown '{self.count_scope}'; allowed: {', '.join(COUNT_SCOPES)}")
        weight_options = {key: value for key, value in weights.items() if key != "name"}
        self.weight_schedule = build_weight_schedule(weights["name"], self.model.k, **weight_options)
        self.backward_schedule = build_backward_schedule(schedule["name"], schedule.get("chunk_rows"))
        self.total_steps = total_steps
        self.consumed_tokens = 0  # weight-schedule position; saved in checkpoints

    # ---- distributed helpers -------------------------------------------------------
    @property
    def world_size(self) -> int:
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            tensor = tensor.clone()
            dist.all_reduce(tensor)
        return tensor

    # ---- objective -----------------------------------------------------------------
    def progress(self) -> Progress:
        return Progress(step=self.global_step, consumed_tokens=self.consumed_tokens, total_steps=self.total_steps)

    def objective_coefficients(self, local_counts: torch.Tensor, batch: dict):
        """(coefficients, counts they were computed from, loss scale for DDP averaging)."""
        lambdas = self.weight_schedule.lambdas(self.progress())
        scope_global = self.count_scope == "global"
        counts = self.all_reduce_sum(local_counts) if scope_global else local_counts
        positions = batch["tokens"].numel() * (self.world_size if scope_global else 1)
        denominator = self.fixed_denominator if self.fixed_denominator is not None else positions
        coeffs = coefficients(self.policy, counts, lambdas, fixed_denominator=denominator)
        # DDP averages gradients over ranks; with global counts each rank's share must be
        # multiplied back by the world size so the sum over ranks is the global objective.
        scale = self.world_size if scope_global else 1
        return coeffs, counts, lambdas, scale

    def local_counts(self, horizons) -> torch.Tensor:
        return torch.stack([h.mask.sum() for h in horizons]).to(torch.float64)  # [K]

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        optimizer.zero_grad(set_to_none=True)
        with SavedTensorMeter(exclude=self.model.parameters()) as meter:
            horizons = self.model(batch)
            coeffs, counts, lambdas, scale = self.objective_coefficients(self.local_counts(horizons), batch)
            # Diagnostics (GradDiagnostics) read this step's graph between forward and backward;
            # they never write .grad, so the step is unchanged. Not counted by the meter.
            if getattr(self, "step_probes", None):
                with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
                    for probe in self.step_probes:
                        probe(self, batch, horizons, (coeffs * scale).to(torch.float32))
            root, stats = self.backward_schedule.run(horizons, (coeffs * scale).to(torch.float32))
            self.manual_backward(root)
        self.clip_gradients(optimizer, gradient_clip_val=self.hparams.optim.get("grad_clip"), gradient_clip_algorithm="norm")
        optimizer.step()
        self.lr_schedulers().step()

        global_sums = self.all_reduce_sum(stats.loss_sums.to(torch.float64))
        loss = (coeffs * (global_sums if self.count_scope == "global" else stats.loss_sums.to(torch.float64))).sum()
        if self.count_scope == "local":
            loss = self.all_reduce_sum(loss) / self.world_size  # what DDP effectively optimises
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss at step {self.global_step}")
        self.consumed_tokens += int(self.all_reduce_sum(batch["active"].sum()).item())
        self.log("train/loss", loss.to(torch.float32), prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
        return {
            "loss": loss.detach(),
            "loss_sums": global_sums,
            "counts": counts,
            "local_counts": stats.counts,
            "correct": None if stats.correct is None else self.all_reduce_sum(stats.correct.to(torch.float64)),
            "coefficients": coeffs,
            "lambdas": lambdas,
            "effective_weights": effective_weights(coeffs, counts),
            "mem/logits_live_bytes": logit_bytes(
                stats.counts.tolist(), horizons[0].weight.shape[0], schedule=self.backward_schedule.name,
                bytes_per_element=horizons[0].hidden.element_size(), chunk_rows=getattr(self.backward_schedule, "chunk_rows", None),
            ),
            "mem/saved_peak_bytes": meter.peak_bytes,
        }

    def validation_step(self, batch, batch_idx):
        horizons = self.model(batch)
        stats = evaluate_horizons(horizons)
        return {"horizons": horizons, "stats": stats}

    # ---- optimisation --------------------------------------------------------------
    def configure_optimizers(self):
        cfg = self.hparams.optim
        decay = [p for p in self.model.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg["lr"],
            betas=tuple(cfg["betas"]),
        )
        warmup = max(1, int(cfg["warmup_steps"]))
        floor = cfg["min_lr_ratio"]

        def lr_factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min(1.0, (step - warmup) / max(1, self.total_steps - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- checkpoint state ----------------------------------------------------------
    def on_save_checkpoint(self, checkpoint):
        # Everything here is plain data or tensors: checkpoints load with weights_only=True.
        checkpoint["mtp_state"] = {"consumed_tokens": self.consumed_tokens, "rng": collect_rng_states()}
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        checkpoint["mtp_manifest"] = build_manifest(self, datamodule)
        checkpoint["mtp_tokenizer"] = tokenizer_payload(datamodule)

    def on_load_checkpoint(self, checkpoint):
        state = checkpoint.get("mtp_state", {})
        self.consumed_tokens = int(state.get("consumed_tokens", 0))
        # Applied in on_train_start, once Lightning has built the data iterators, so the
        # RNG streams continue exactly where the interrupted run left them.
        self._pending_rng = state.get("rng")
        self._loaded_aliases = (checkpoint.get("mtp_manifest") or {}).get("aliases")

    def on_train_start(self):
        if getattr(self, "_pending_rng", None) is not None:
            restore_rng_states(self._pending_rng)
            self._pending_rng = None
        # Weights load in place before configure_optimizers binds the Parameters; check it held.
        verify_restored(self, self.optimizers(use_pl_optimizer=False), getattr(self, "_loaded_aliases", None))

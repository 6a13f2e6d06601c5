"""The LightningModule: wires model, reduction, weight schedule and backward schedule.

The step itself is `lab.step.train_step` (shared with the plain-PyTorch benchmark loop);
this module supplies Lightning's backward and optimizer, logs `train/objective` (what the step
optimised: Σ_k c_k S_k, whose meaning depends on K, the policy and λ) and `train/loss` (the
next-token loss S_1 / N_1, comparable across every run), keeps the
weight-schedule position and the checkpoint state. Manual optimisation, so exactly one
`manual_backward` per step touches module Parameters (one DDP sync). Metrics logic lives in
callbacks; `training_step` returns {"loss", "step": StepOutputs} for them.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from lab.checkpoint import (
    build_manifest,
    collect_rng_states,
    restore_rng_states,
    tokenizer_payload,
    verify_restored,
)
from lab.distributed import all_reduce_sum, world_size
from lab.model.mtp import build_model
from lab.objective import Progress, evaluate_horizons
from lab.objective.objective import Objective, typed
from lab.optim import OptimConfig, build_optimizer
from lab.step import StepOutputs, StepProbe, train_step


class LightningOptimization:
    """The step's gradient application through Lightning (precision, DDP and clipping hooks included)."""

    def __init__(self, module: "MTPLitModule"):
        self.module = module
        self.optimizer = module.optimizers()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, root: torch.Tensor) -> None:
        self.module.manual_backward(root)

    def update(self) -> None:
        self.module.clip_gradients(self.optimizer, gradient_clip_val=self.module.optim.grad_clip, gradient_clip_algorithm="norm")
        self.optimizer.step()
        self.module.lr_schedulers().step()


class MTPLitModule(pl.LightningModule):
    def __init__(self, model: dict, head: dict, reduction: dict, weights: dict, schedule: dict, optim: dict, total_steps: int):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.model = build_model(model, head)
        self.objective = Objective.build(reduction, weights, schedule, k=self.model.k)
        self.optim = typed(OptimConfig, optim, "optim")
        self.total_steps = total_steps
        self.consumed_tokens = 0  # weight-schedule position; saved in checkpoints
        # Declared hook: callbacks add probes that read each step's graph (GradDiagnostics).
        self.step_probes: list[StepProbe] = []

    # ---- distributed helpers (for callbacks) ------------------------------------------
    @property
    def world_size(self) -> int:
        return world_size()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(tensor)

    # ---- the step ------------------------------------------------------------------
    def progress(self) -> Progress:
        return Progress(step=self.global_step, consumed_tokens=self.consumed_tokens, total_steps=self.total_steps)

    def training_step(self, batch, batch_idx):
        outputs = train_step(self.model, self.objective, batch, self.progress(), LightningOptimization(self), probes=self.step_probes)
        self.consumed_tokens += outputs.tokens
        self.log("train/objective", outputs.loss.to(torch.float32), prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
        self.log("train/loss", self.next_token_loss(outputs).to(torch.float32), prog_bar=True, on_step=True, on_epoch=False,
                 batch_size=1)
        return {"loss": outputs.loss, "step": outputs}

    def next_token_loss(self, outputs: StepOutputs) -> torch.Tensor:
        """Mean next-token cross-entropy of the step over all ranks: S_1 / N_1 (global counts)."""
        n1 = outputs.counts[0] if self.objective.global_counts else self.all_reduce_sum(outputs.local_counts[:1].to(torch.float64))[0]
        return outputs.loss_sums[0] / n1.clamp_min(1.0)  # [] float64; an empty horizon 1 gives 0

    def validation_step(self, batch, batch_idx):
        horizons = self.model(batch)
        stats = evaluate_horizons(horizons)
        return {"horizons": horizons, "stats": stats}

    # ---- optimisation --------------------------------------------------------------
    def configure_optimizers(self):
        optimizer, scheduler = build_optimizer(self.model, self.optim, self.total_steps)
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

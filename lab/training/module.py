"""The LightningModule: wires model, reduction, weight schedule and backward schedule.

The step itself is `lab.training.step.train_step` (shared with the plain-PyTorch benchmark loop);
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

from lab.training.cadence import logs_this_step
from lab.checkpoint.base_model import drop_base_weights, with_base_weights
from lab.checkpoint import (
    build_manifest,
    collect_rng_states_of_every_rank,
    restore_rng_states,
    rng_states_for_rank,
    tokenizer_payload,
    verify_restored,
)
from lab.objective.distributed import all_reduce_sum, world_size
from lab.model.compile import compile_units, split_compile_option
from lab.training.checked_groups import CheckedGroups
from lab.model.mtp import MTPModel, build_model, model_config
from lab.objective import Progress, evaluate_horizons
from lab.objective.objective import Objective, typed
from lab.objective.readings import read_horizons
from lab.training.optim import OptimConfig, build_optimizer, matrix_parameters
from lab.training.sharding import clip_gradient_norm
from lab.training.router_balance import build_router_balance
from lab.training.step import StepOutputs, StepProbe, train_step


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
        clip_gradient_norm(self.module, self.optimizer, self.module.optim.grad_clip)
        self.optimizer.step()
        self.module.lr_schedulers().step()


class MTPLitModule(pl.LightningModule):
    def __init__(self, model: dict, head: dict, reduction: dict, weights: dict, schedule: dict, optim: dict, total_steps: int,
                 objective: dict | None = None, checked: CheckedGroups | None = None):
        """The groups' mappings are the module's hyperparameters (a checkpoint rebuilds it from them); `checked`:
        the typed groups `lab.config.checks.check_config` made from the same mappings, used as they are."""
        super().__init__()
        self.save_hyperparameters(ignore=["checked"])
        self.automatic_optimization = False
        model, compiled = split_compile_option(model)
        self.model = build_model(model, head) if checked is None else MTPModel(model_config(model), checked.head)
        if compiled:
            compile_units(self.model)
        self.router_balance = build_router_balance(self.model)  # None unless model.router is on (an MoE model)
        self.matrix_parameters = matrix_parameters(self.model)  # before any FSDP wrapping (lab/training/optim.py)
        self.objective = checked.objective if checked is not None else Objective.build(reduction, weights, schedule, k=self.model.k,
                                                                                       objective=objective)
        self.init_from: dict | None = None  # the parent's record when the weights came from `init_from` (manifest)
        self.optim = checked.optim if checked is not None else typed(OptimConfig, optim, "optim")
        self.total_steps = total_steps
        self.consumed_tokens = 0  # weight-schedule position; saved in checkpoints
        # Declared hooks for callbacks: probes that read each step's graph (GradDiagnostics), and how
        # often the step measures saved-tensor memory (MemoryMetrics; None = never).
        self.step_probes: list[StepProbe] = []
        self.memory_every_n_steps: int | None = None

    # ---- distributed helpers (for callbacks) ------------------------------------------
    @property
    def world_size(self) -> int:
        return world_size()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(tensor)

    # ---- the step ------------------------------------------------------------------
    def progress(self) -> Progress:
        return Progress(step=self.global_step, consumed_tokens=self.consumed_tokens, total_steps=self.total_steps)

    def measures_memory(self) -> bool:
        """Saved-tensor memory is measured at step 0 and every `memory_every_n_steps` steps of the run.

        The schedule follows the run's step, not the process: a resumed run measures the same
        steps as an uninterrupted one, so their metrics.csv files are equal (issue 13)."""
        n = self.memory_every_n_steps
        return n is not None and self.global_step % n == 0

    def training_step(self, batch, batch_idx):
        outputs = train_step(self.model, self.objective, batch, self.progress(), LightningOptimization(self),
                             probes=self.step_probes, measure_memory=self.measures_memory(),
                             measure_acceptance=self.model.k > 1 and logs_this_step(self._trainer), router_balance=self.router_balance)
        self.consumed_tokens += outputs.tokens
        if logs_this_step(self._trainer):  # self.log costs; steps whose values no logger receives skip it
            self.log("train/objective", outputs.loss.to(torch.float32), prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
            self.log("train/loss", self.next_token_loss(outputs).to(torch.float32), prog_bar=True, on_step=True, on_epoch=False,
                     batch_size=1)
        return {"loss": outputs.loss, "step": outputs}

    def next_token_loss(self, outputs: StepOutputs) -> torch.Tensor:
        """Mean next-token cross-entropy of the step over all ranks: S_1 / N_1 (StepOutputs counts are over ranks)."""
        return outputs.loss_sums[0] / outputs.counts[0].clamp_min(1.0)  # [] float64; an empty horizon 1 gives 0

    def validation_step(self, batch, batch_idx):
        horizons = self.model(batch)
        stats = evaluate_horizons(horizons)
        acceptance = read_horizons(horizons, with_acceptance=True).sums() if len(horizons) > 1 else None  # [K, 3]
        return {"horizons": horizons, "stats": stats, "acceptance": acceptance}

    # ---- optimisation --------------------------------------------------------------
    def configure_optimizers(self):
        optimizer, scheduler = build_optimizer(self.model, self.optim, self.total_steps, self.matrix_parameters)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- checkpoint state ----------------------------------------------------------
    def on_save_checkpoint(self, checkpoint):
        # Everything here is plain data or tensors: checkpoints load with weights_only=True.
        rng = collect_rng_states_of_every_rank()  # a collective under DDP: every rank dumps the checkpoint
        checkpoint["mtp_state"] = {"consumed_tokens": self.consumed_tokens, "rng": rng[0], "rng_by_rank": rng}
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        checkpoint["mtp_manifest"] = build_manifest(self, datamodule)
        checkpoint["mtp_tokenizer"] = tokenizer_payload(datamodule)
        drop_base_weights(checkpoint, self.model)  # a frozen / LoRA run's base is named by the manifest, not stored

    def load_state_dict(self, state_dict, strict: bool = True, **kwargs):
        return super().load_state_dict(with_base_weights(state_dict, self), strict=strict, **kwargs)

    def on_load_checkpoint(self, checkpoint):
        state = checkpoint.get("mtp_state", {})
        self.consumed_tokens = int(state.get("consumed_tokens", 0))
        # Applied in on_train_start, once Lightning has built the data iterators, so the
        # RNG streams continue exactly where the interrupted run left them.
        self._pending_rng = rng_states_for_rank(state, self.global_rank, self.world_size)
        self._loaded_aliases = (checkpoint.get("mtp_manifest") or {}).get("aliases")

    def on_train_start(self):
        if getattr(self, "_pending_rng", None) is not None:
            restore_rng_states(self._pending_rng)
            self._pending_rng = None
        # Weights load in place before configure_optimizers binds the Parameters; check it held.
        verify_restored(self, self.optimizers(use_pl_optimizer=False), getattr(self, "_loaded_aliases", None))

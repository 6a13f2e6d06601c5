"""Throughput on Lightning's progress bar (and in every logger and the sweep report).

Every `window` steps: `train/tokens_per_s` (token positions of the global batch per second
of wall time), `train/mfu` (model FLOPs utilisation: training FLOPs per token × tokens/s ÷
(peak FLOP/s per device × devices); logged when the peak is known, see peak_flops.py) and,
on CUDA, `mem/cuda_peak_bytes` (torch's peak allocated bytes on this device during the window).

FLOPs per token come from `flops_per_token(model, seq_len)`, by default the FlopCounterMode
count of lab/model/flop_count.py. On CUDA the window is closed by one device synchronisation
(once per window, not per step) so queued work is timed where it ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytorch_lightning as pl
import torch

from lab.callbacks.peak_flops import resolve_peak_flops
from lab.model.flop_count import counted_training_flops_per_token


class TokenThroughput(pl.Callback):
    def __init__(self, window: int = 10, peak_flops: float | str | None = "auto", flops_per_token: Callable | None = None):
        self.window = window
        self.peak_flops_spec = peak_flops
        resolve_peak_flops(peak_flops, torch.device("cpu"))  # a bad value stops the run before it starts
        self.flops_per_token_fn = flops_per_token or counted_training_flops_per_token
        self.peak_flops: float | None = None
        self.flops_per_token: float | None = None
        self._start = None
        self._tokens = 0
        self._steps = 0

    def setup(self, trainer, pl_module, stage):
        self.peak_flops = resolve_peak_flops(self.peak_flops_spec, trainer.strategy.root_device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.flops_per_token is None:
            self.flops_per_token = float(self.flops_per_token_fn(pl_module.model, batch["tokens"].shape[1]))
        if self._start is None:
            self._synchronize(pl_module)
            self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._tokens += int(batch["tokens"].numel()) * trainer.world_size
        self._steps += 1
        if self._steps < self.window:
            return
        self._synchronize(pl_module)
        tokens_per_s = self._tokens / max(time.perf_counter() - self._start, 1e-9)
        metrics = {"train/tokens_per_s": tokens_per_s}
        if self.peak_flops is not None:
            metrics["train/mfu"] = self.flops_per_token * tokens_per_s / (self.peak_flops * trainer.world_size)
        if pl_module.device.type == "cuda":
            metrics["mem/cuda_peak_bytes"] = float(torch.cuda.max_memory_allocated(pl_module.device))
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        for name, value in metrics.items():
            pl_module.log(name, value, prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
        self._start, self._tokens, self._steps = time.perf_counter(), 0, 0

    @staticmethod
    def _synchronize(pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

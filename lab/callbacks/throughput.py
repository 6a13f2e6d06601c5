"""Tokens per second on Lightning's progress bar (and in every logger), measured between logging steps."""

import time

import pytorch_lightning as pl

from lab.callbacks.cadence import logs_this_step


class TokenThroughput(pl.Callback):
    """`train/tokens_per_s` over the steps since the previous logging step; no work on the steps in between."""

    def __init__(self, window: int = 10):
        self.window = window  # kept for old configs; the window is now the logging interval
        self._start: float | None = None
        self._start_step = 0

    def on_train_start(self, trainer, pl_module):
        self._start, self._start_step = None, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._start is None:
            self._start, self._start_step = time.perf_counter(), trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not logs_this_step(trainer):
            return
        now = time.perf_counter()
        steps = trainer.global_step - self._start_step
        tokens = steps * int(batch["tokens"].numel()) * trainer.world_size  # every batch has the same shape
        pl_module.log("train/tokens_per_s", tokens / max(now - self._start, 1e-9), prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
        self._start, self._start_step = now, trainer.global_step

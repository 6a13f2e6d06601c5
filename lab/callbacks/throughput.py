"""Tokens per second: on Lightning's progress bar (and in every logger) between logging steps, and run totals for run.json."""

import time

import pytorch_lightning as pl

from lab.callbacks.cadence import logs_this_step


class TokenThroughput(pl.Callback):
    """`train/tokens_per_s` over the steps since the previous logging step; `summary()` over the whole fit.

    Tokens are the token positions of the global batch (all ranks, padding included). The
    run totals time only the training steps (batch start to batch end: forward, backward,
    optimizer), so validation and checkpoint writes don't dilute tokens/s; `fit_time_s` is
    the wall time from the first to the last training step, everything included. Steps that
    log nothing only read the clock.
    """

    def __init__(self, window: int = 10):
        self.window = window  # kept for old configs; the window is now the logging interval
        self._start: float | None = None
        self._start_step = 0
        self._step_start = None
        self._fit_start = None
        self._fit_end = None
        self.total_tokens = 0
        self.total_step_time_s = 0.0

    def on_train_start(self, trainer, pl_module):
        self._start, self._start_step = None, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        now = time.perf_counter()
        if self._start is None:
            self._start, self._start_step = now, trainer.global_step
        if self._fit_start is None:
            self._fit_start = now
        self._step_start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.perf_counter()
        batch_tokens = int(batch["tokens"].numel()) * trainer.world_size  # every batch has the same shape
        self.total_tokens += batch_tokens
        self.total_step_time_s += now - self._step_start
        self._fit_end = now
        if not logs_this_step(trainer):
            return
        steps = trainer.global_step - self._start_step
        pl_module.log("train/tokens_per_s", steps * batch_tokens / max(now - self._start, 1e-9), prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
        self._start, self._start_step = now, trainer.global_step

    def summary(self) -> dict:
        """Measured run totals (this process's attempt; empty before the first step)."""
        if not self.total_tokens:
            return {}
        return {
            "train_tokens": self.total_tokens,
            "train_time_s": self.total_step_time_s,
            "train_tokens_per_s": self.total_tokens / max(self.total_step_time_s, 1e-9),
            "fit_time_s": self._fit_end - self._fit_start,
        }

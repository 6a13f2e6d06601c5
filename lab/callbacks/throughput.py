"""Tokens per second: windowed on Lightning's progress bar (and in every logger), and run totals for run.json."""

import time

import pytorch_lightning as pl


class TokenThroughput(pl.Callback):
    """`train/tokens_per_s` over the last `window` steps; `summary()` over the whole fit.

    Tokens are the token positions of the global batch (all ranks, padding included). The
    run totals time only the training steps (batch start to batch end: forward, backward,
    optimizer), so validation and checkpoint writes don't dilute tokens/s; `fit_time_s` is
    the wall time from the first to the last training step, everything included.
    """

    def __init__(self, window: int = 10):
        self.window = window
        self._start = None
        self._tokens = 0
        self._steps = 0
        self._step_start = None
        self._fit_start = None
        self._fit_end = None
        self.total_tokens = 0
        self.total_step_time_s = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        now = time.perf_counter()
        if self._start is None:
            self._start = now
        if self._fit_start is None:
            self._fit_start = now
        self._step_start = now

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.perf_counter()
        tokens = int(batch["tokens"].numel()) * trainer.world_size
        self.total_tokens += tokens
        self.total_step_time_s += now - self._step_start
        self._fit_end = now
        self._tokens += tokens
        self._steps += 1
        if self._steps >= self.window:
            elapsed = now - self._start
            pl_module.log("train/tokens_per_s", self._tokens / max(elapsed, 1e-9), prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
            self._start, self._tokens, self._steps = time.perf_counter(), 0, 0

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

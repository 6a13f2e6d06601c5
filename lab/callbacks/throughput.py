"""Tokens per second on Lightning's progress bar (and in every logger)."""

import time

import pytorch_lightning as pl


class TokenThroughput(pl.Callback):
    def __init__(self, window: int = 10):
        self.window = window
        self._start = None
        self._tokens = 0
        self._steps = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._start is None:
            self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._tokens += int(batch["tokens"].numel()) * trainer.world_size
        self._steps += 1
        if self._steps >= self.window:
            elapsed = time.perf_counter() - self._start
            pl_module.log("train/tokens_per_s", self._tokens / max(elapsed, 1e-9), prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
            self._start, self._tokens, self._steps = time.perf_counter(), 0, 0

"""A Lightning callback that SIGKILLs its own process at a named point: reproducible hard kills for resume tests.

Added to a job with `+callbacks.chaos._target_=tests.chaos_hooks.KillAt`; disarmed unless the
environment names the point and the run directory:

    MTP_LAB_KILL_AT=<point>@<global step>   MTP_LAB_KILL_DIR=<run dir name>

`SignalAt` sends a signal instead (`+callbacks.signal._target_=tests.chaos_hooks.SignalAt`,
`MTP_LAB_SIGNAL_AT=<SIGTERM|SIGINT>@<global step>`) once the step's training batch is done:
SIGTERM to its own process (a scheduler's preemption), SIGINT to its whole process group (what
a terminal's Ctrl-C does to a foreground job).

Points: `batch_end` (a training step done, its checkpoint not yet in place), `batch_start`
(a step's staged checkpoint not yet renamed into place), `validation` (mid-validation, after
its first batch), `checkpoint_write` (the checkpoint bytes are in the temp file, not yet
renamed: leaves an orphaned `.partial`), `train_end` (after the final checkpoint, before
run.json records the end).
"""

from __future__ import annotations

import os
import signal
import time

import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig

POINTS = ("batch_end", "batch_start", "validation", "checkpoint_write", "train_end")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillAt(pl.Callback):
    def __init__(self):
        point, _, step = os.environ.get("MTP_LAB_KILL_AT", "").partition("@")
        here = os.path.basename(os.path.normpath(HydraConfig.get().runtime.output_dir))
        armed = bool(point) and here == os.environ.get("MTP_LAB_KILL_DIR")
        if armed and point not in POINTS:
            raise ValueError(f"MTP_LAB_KILL_AT: unknown point {point!r}; known: {', '.join(POINTS)}")
        self.point, self.step = (point, int(step)) if armed else (None, -1)

    def _at(self, point: str, trainer) -> bool:
        return self.point == point and trainer.global_step == self.step and not trainer.sanity_checking

    def setup(self, trainer, pl_module, stage):
        if self.point != "checkpoint_write":
            return
        io = trainer.strategy.checkpoint_io
        write = io._write  # lab.checkpoint.io.SafeCheckpointIO's write into its temp file

        def write_then_die(checkpoint, file):
            write(checkpoint, file)
            if trainer.global_step == self.step:
                file.flush()
                die()

        io._write = write_then_die

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self._at("batch_end", trainer):
            die()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._at("batch_start", trainer):
            die()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self._at("validation", trainer):
            die()

    def on_train_end(self, trainer, pl_module):
        if self._at("train_end", trainer):
            die()


class SignalAt(pl.Callback):
    """`MTP_LAB_SIGNAL_WHERE=validation`: the signal comes after the first batch of the validation that
    follows the step instead (the step = trainer.max_steps: the final validation). `MTP_LAB_SIGNAL_TIMES=2`:
    a second signal 0.05 s after the first (an impatient double Ctrl-C)."""

    def __init__(self):
        name, _, step = os.environ.get("MTP_LAB_SIGNAL_AT", "").partition("@")
        self.signum, self.step = (signal.Signals[name], int(step)) if name else (None, -1)
        self.where = os.environ.get("MTP_LAB_SIGNAL_WHERE", "batch_end")
        self.times = int(os.environ.get("MTP_LAB_SIGNAL_TIMES", "1"))

    def _send(self, trainer, where: str) -> None:
        if self.signum is None or trainer.global_step != self.step or where != self.where or trainer.sanity_checking:
            return
        for n in range(self.times):
            if n:
                time.sleep(0.05)
            if self.signum == signal.SIGINT:
                os.killpg(os.getpgid(0), signal.SIGINT)
            else:
                os.kill(os.getpid(), self.signum)
        self.signum = None  # once

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._send(trainer, "batch_end")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._send(trainer, "validation")

    def setup(self, trainer, pl_module, stage):
        """`MTP_LAB_SIGNAL_WHERE=decoding`: the signal comes as the end-of-run decoding evaluation starts."""
        from lab.callbacks.decoding import DecodingEval

        for callback in trainer.callbacks:
            if isinstance(callback, DecodingEval):
                evaluate = callback.evaluate

                def signalled_evaluate(*args, evaluate=evaluate, **kwargs):
                    self._send(trainer, "decoding")
                    return evaluate(*args, **kwargs)

                callback.evaluate = signalled_evaluate

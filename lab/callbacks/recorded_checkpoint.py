"""Checkpoints that never get ahead of the run's records.

A resumed run keeps the metrics.csv rows logged before its checkpoint's step and continues
from there (lab/tracking/csv_history.py), so a checkpoint of step s must only become `last.ckpt`
once every row of the steps before s is on disk. Lightning's `ModelCheckpoint` writes a
step checkpoint in `on_train_batch_end`, before that step's metrics reach the loggers and
before the validation that may follow the step; a kill in between loses those rows for
good (the resumed run does not redo them). `RecordedCheckpoint` orders things:

- a step checkpoint that falls on a validation step is written after that validation
  (Lightning's own deferral to `on_validation_end`), so its validation rows are recorded
  and a kill during the validation resumes from the previous checkpoint and redoes it;
- any other step checkpoint is written next to its target (`.last.ckpt.staged`) and
  renamed into place at the next batch start (or at the end of training), once the loggers
  have flushed that step's rows;
- the loggers are flushed before every checkpoint write;
- a run told to stop (SIGTERM, SIGINT: lab/callbacks/stop_on_signal.py) writes `last.ckpt`
  for the step it reached the same way, whatever `every_n_train_steps` says, and publishes
  it when the run stops before the next step;
- `trainer.callback_metrics` travel in the checkpoint, so a resumed run's final metrics
  (run.json, runs.csv) equal an uninterrupted run's even when the resumed part logs
  fewer metrics (e.g. a throughput window that did not complete).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lab.callbacks.stop_on_signal import stop_requested
from lab.checkpoint.files import fsync_dir, staged_path
from lab.errors import RunInterrupted

METRICS_KEY = "mtp_callback_metrics"


def flush_loggers(trainer) -> None:
    for logger in trainer.loggers:
        logger.save()


def validation_follows(trainer) -> bool:
    """Whether Lightning runs a validation right after the current training batch (its own rule)."""
    loop = trainer.fit_loop
    return bool(loop.epoch_loop._should_check_val_fx(loop._data_fetcher))


class RecordedCheckpoint(ModelCheckpoint):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._staged: list[tuple[Path, str]] = []
        self._staging = False
        self._restored_metrics: dict | None = None

    # ---- when a step checkpoint is written ----------------------------------------------------

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        due = self._every_n_train_steps >= 1 and trainer.global_step % self._every_n_train_steps == 0
        stopping = stop_requested(trainer) and bool(self.save_last)  # the run stops after this step
        if (due or stopping) and not self._should_skip_saving_checkpoint(trainer) and validation_follows(trainer):
            self._defer_save_until_validation = True  # ModelCheckpoint.on_validation_end writes it
            return
        self._staging = True
        try:
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            if stopping and not self._should_skip_saving_checkpoint(trainer):
                self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        finally:
            self._staging = False

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        flush_loggers(trainer)
        if not self._staging:
            super()._save_checkpoint(trainer, filepath)
            return
        staged = staged_path(filepath)
        super()._save_checkpoint(trainer, str(staged))
        self._last_checkpoint_saved = filepath
        self._staged.append((staged, filepath))

    def _publish(self, trainer) -> None:
        """Rename staged checkpoints into place once the rows of their steps are on disk."""
        if not self._staged:
            return
        flush_loggers(trainer)
        if trainer.is_global_zero:
            for staged, filepath in self._staged:
                os.replace(staged, filepath)
                fsync_dir(Path(filepath).parent)
        self._staged = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._publish(trainer)

    def on_validation_start(self, trainer, pl_module):
        self._publish(trainer)

    def on_train_end(self, trainer, pl_module):
        self._publish(trainer)
        super().on_train_end(trainer, pl_module)

    def on_exception(self, trainer, pl_module, exception):
        # A signalled run stops once the step's rows are logged: the step's checkpoint may go in place.
        if isinstance(exception, (RunInterrupted, SIGTERMException)):
            self._publish(trainer)

    # ---- final metrics across a resume --------------------------------------------------------

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        # A resumed fit that has not re-logged a metric yet still carries its value from before its checkpoint.
        carried = dict(self._restored_metrics or {})
        carried.update(trainer.callback_metrics)
        checkpoint[METRICS_KEY] = {name: torch.as_tensor(value).detach().cpu().clone() for name, value in carried.items()}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        self._restored_metrics = checkpoint.get(METRICS_KEY)

    def on_fit_end(self, trainer, pl_module):
        super().on_fit_end(trainer, pl_module)
        if self._restored_metrics:
            # Lightning clears callback_metrics when fit starts: what the resumed part did not log
            # again keeps its value from before the checkpoint (also when nothing was left to train).
            for name, value in self._restored_metrics.items():
                trainer.callback_metrics.setdefault(name, value)
            self._restored_metrics = None

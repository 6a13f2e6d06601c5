"""The progress bar, redrawn on logging steps only.

Lightning's default bar reads every progress-bar metric back to the host (`.item()`) and
schedules a redraw on every training step, and its rich variant polls for redraws 100 times
a second. This one is the same bar, updated on the steps whose metrics reach the loggers
(`trainer.log_every_n_steps`) and redrawn at most once a second.
"""

from __future__ import annotations

from pytorch_lightning.callbacks import RichProgressBar, TQDMProgressBar
from pytorch_lightning.utilities.imports import _RICH_AVAILABLE

from lab.callbacks.cadence import logs_this_step


class LoggingStepsRichProgressBar(RichProgressBar):
    def __init__(self):
        super().__init__(refresh_rate=1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if logs_this_step(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class LoggingStepsTQDMProgressBar(TQDMProgressBar):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if logs_this_step(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def progress_bar():
    """The bar Lightning would choose (rich when installed, else tqdm), on logging steps only."""
    return LoggingStepsRichProgressBar() if _RICH_AVAILABLE else LoggingStepsTQDMProgressBar()

"""The progress bar: next-token loss, the objective (when it differs), tokens/s as `12.3k`, MFU, the latest validation loss;
and, where the bar is off (sweeps), a progress line every `every_s` seconds.

Lightning's bar shows every `prog_bar=True` metric under its full name with four significant
digits (`train/tokens_per_s=1.23e+04`) and no validation loss once validation has passed. It
counts batches of the current epoch, so after a resume it shows no total and no ETA. This bar
counts optimizer steps against `trainer.max_steps` (a resumed run starts at its step, and tqdm's
rate and ETA cover the steps this process ran). It reads the metrics back to the host (`.item()`)
only on the steps whose metrics reach the loggers (`trainer.log_every_n_steps`); in between it
redraws the step counter at most every REDRAW_S seconds, which costs nothing measurable.
"""

from __future__ import annotations

import sys
import time

import pytorch_lightning as pl
from pytorch_lightning.callbacks import TQDMProgressBar

from lab.training.cadence import logs_this_step

REDRAW_S = 1.0  # the bar's step counter redraws at least this often, whatever the logging cadence

# logged metric → (label on the bar, format)
SHOWN = (
    ("train/loss", "loss", "{:.3f}"),
    ("train/objective", "obj", "{:.3f}"),
    ("val/loss", "val", "{:.3f}"),
    ("train/mfu", "mfu", "{:.1%}"),
)


def human_rate(value: float) -> str:
    """12345.6 → '12.3k', 2.5e6 → '2.50M', 950 → '950'."""
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


class TokenProgressBar(TQDMProgressBar):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._counting_steps = False
        self._drawn = 0.0

    def on_train_start(self, trainer, *args):
        super().on_train_start(trainer, *args)
        if trainer.max_steps is not None and trainer.max_steps > 0:  # a step-bounded run: one bar over every epoch
            bar = self.train_progress_bar
            bar.reset(total=trainer.max_steps)
            bar.initial = bar.n = trainer.global_step  # a resumed run starts at its step: tqdm's rate and ETA cover this process
            bar.set_description("step")
            self._counting_steps = True

    def on_train_epoch_start(self, trainer, *_):
        if not self._counting_steps:  # an epoch-bounded run: Lightning's per-epoch bar
            super().on_train_epoch_start(trainer, *_)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not self._counting_steps:
            if logs_this_step(trainer):
                super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        bar, now = self.train_progress_bar, time.monotonic()
        if bar is None or bar.disable:
            return
        if logs_this_step(trainer):
            bar.n = trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=True)
            self._drawn = now
        elif now - self._drawn >= REDRAW_S:
            bar.n = trainer.global_step
            bar.refresh()
            self._drawn = now

    def get_metrics(self, trainer, pl_module) -> dict:
        logged = {**trainer.callback_metrics, **trainer.progress_bar_metrics}  # val/loss stays in callback_metrics
        items: dict = {}
        for name, label, pattern in SHOWN:
            if name in logged:
                items[label] = pattern.format(float(logged[name]))
        if items.get("obj") == items.get("loss"):  # next-token-only objective (ntp): one number is enough
            items.pop("obj", None)
        if "train/tokens_per_s" in logged:
            items["tok/s"] = human_rate(float(logged["train/tokens_per_s"]))
        if "mem/cuda_peak_bytes" in logged:
            items["cuda"] = f"{float(logged['mem/cuda_peak_bytes']) / 2**30:.1f}GiB"
        return items


class ProgressLines(pl.Callback):
    """One line every `every_s` seconds while training when the progress bar is off (sweep jobs, logs):
    `step 120/240 (50%) · 1.0k tok/s · loss 2.912 · ETA 35.0s`. Reads metrics only when it prints."""

    def __init__(self, every_s: float = 30.0):
        self.every_s = every_s
        self._start: tuple[float, int] | None = None
        self._printed = 0.0

    def on_train_start(self, trainer, pl_module):
        self._start = (time.monotonic(), trainer.global_step)
        self._printed = time.monotonic()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.monotonic()
        if self._start is None or trainer.progress_bar_callback is not None or now - self._printed < self.every_s:
            return
        self._printed = now
        print(progress_line(trainer, *self._start, now), file=sys.stderr, flush=True)


def progress_line(trainer, started: float, first_step: int, now: float) -> str:
    step, total = trainer.global_step, trainer.max_steps
    rate = (step - first_step) / max(now - started, 1e-9)  # steps per second in this process
    parts = [f"step {step}/{total} ({step / total:.0%})" if total and total > 0 else f"step {step}"]
    logged = trainer.callback_metrics
    if "train/tokens_per_s" in logged:
        parts.append(f"{human_rate(float(logged['train/tokens_per_s']))} tok/s")
    if "train/loss" in logged:
        parts.append(f"loss {float(logged['train/loss']):.3f}")
    if total and total > 0 and rate > 0:
        left = int((total - step) / rate + 0.5)
        parts.append(f"ETA {left // 60}m {left % 60:02d}s")
    return " · ".join(parts)

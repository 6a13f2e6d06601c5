"""Throughput on Lightning's progress bar (and in every logger and the sweep report).

On Lightning's logging steps: `train/tokens_per_s` (token positions of the global batch per second
of wall time), `train/mfu` (model FLOPs utilisation: training FLOPs per token × tokens/s ÷
(peak FLOP/s per device × devices); logged when the peak is known, see peak_flops.py) and,
on CUDA, `mem/cuda_peak_bytes` (torch's peak allocated bytes on this device since the last logging
step). `summary()` gives run totals for run.json (kept in checkpoints, so a resumed run's totals count every
step once): only the training steps are timed (batch start
to batch end), so validation and checkpoint writes don't dilute tokens/s; `fit_time_s` is the wall
time from the first to the last training step. Steps that log nothing only read the clock.

Every training step is also timed by a Stopwatch (lab.tracking.timing): the worker thread's and the
process's CPU time beside the wall time, torch's threads and the load average at the first and last
step. Logging steps add `train/cpu_share` and `train/contended` for their window; the summary keeps the
run's totals (`train_thread_cpu_s`, `train_tokens_per_cpu_s`, `train_contended`, ...), and at the end of
training `train/contended` and `train/cpu_share` join the final metrics.

FLOPs per token come from `flops_per_token(model, seq_len)`, by default the training FLOP
count of lab/nn/flops.py (the one the cost record and the sweep report use). On CUDA the window is closed by one device synchronisation
(once per logging interval, not per step) so queued work is timed where it ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytorch_lightning as pl
import torch

from lab.callbacks.peak_flops import resolve_peak_flops
from lab.training.cadence import logs_this_step
from lab.tracking.timing import Span, Stopwatch
from lab.nn.flops import training_flops_per_token


class TokenThroughput(pl.Callback):
    """Throughput metrics on logging steps; `window` is kept for old configs (the interval is Lightning's logging interval)."""

    def __init__(self, window: int = 10, peak_flops: float | str | None = "auto", flops_per_token: Callable | None = None):
        self.window = window
        self.peak_flops_spec = peak_flops
        resolve_peak_flops(peak_flops, torch.device("cpu"))  # a bad value stops the run before it starts
        self.flops_per_token_fn = flops_per_token or training_flops_per_token
        self.peak_flops: float | None = None
        self.flops_per_token: float | None = None
        self._start: float | None = None
        self._start_step = 0
        self._step_start = None
        self._fit_start = None
        self._fit_end = None
        self.total_tokens = 0
        self.total_step_time_s = 0.0
        self._earlier_fit_time_s = 0.0  # wall time of earlier attempts, restored from the checkpoint
        self._watch = Stopwatch()  # every training step of this attempt
        self._window = Span()  # the steps since the last logging step
        self._earlier_steps: Span | None = None  # the steps of earlier attempts, restored from the checkpoint
        self._verdict_logged = False

    def setup(self, trainer, pl_module, stage):
        self.peak_flops = resolve_peak_flops(self.peak_flops_spec, trainer.strategy.root_device)
        self._watch = Stopwatch(trainer.strategy.root_device)

    def on_train_start(self, trainer, pl_module):
        self._start, self._start_step = None, 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.flops_per_token is None:
            self.flops_per_token = float(self.flops_per_token_fn(pl_module.model, batch["tokens"].shape[1]))
        if self._start is None:
            self._synchronize(pl_module)
            self._start, self._start_step = time.perf_counter(), trainer.global_step
        now = time.perf_counter()
        if self._fit_start is None:
            self._fit_start = now
        self._step_start = now
        self._watch.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = self._watch.stop()
        self._window = step if self._window.wall_s == 0 else self._window.plus(step)
        now = time.perf_counter()
        batch_tokens = int(batch["tokens"].numel()) * trainer.world_size  # every batch has the same shape
        self.total_tokens += batch_tokens
        self.total_step_time_s += now - self._step_start
        self._fit_end = now
        if not logs_this_step(trainer):
            return
        self._synchronize(pl_module)
        steps = trainer.global_step - self._start_step
        tokens_per_s = steps * batch_tokens / max(time.perf_counter() - self._start, 1e-9)
        metrics = {"train/tokens_per_s": tokens_per_s, "train/cpu_share": self._window.cpu_share,
                   "train/contended": float(self._window.contended)}
        self._window = Span()
        if self.peak_flops is not None:
            metrics["train/mfu"] = self.flops_per_token * tokens_per_s / (self.peak_flops * trainer.world_size)
        if pl_module.device.type == "cuda":
            metrics["mem/cuda_peak_bytes"] = float(torch.cuda.max_memory_allocated(pl_module.device))
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        for name, value in metrics.items():
            pl_module.log(name, value, prog_bar=True, on_step=True, on_epoch=False, batch_size=1)
        self._start, self._start_step = time.perf_counter(), trainer.global_step

    def state_dict(self) -> dict:
        """The run's totals so far, in every checkpoint: a resumed run's summary counts each step once."""
        steps = self.steps_span()
        return {"total_tokens": self.total_tokens, "total_step_time_s": self.total_step_time_s,
                "fit_time_s": self._fit_time_s(), **({"steps_timing": steps.record()} if steps is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        self.total_tokens, self.total_step_time_s = int(state["total_tokens"]), float(state["total_step_time_s"])
        self._earlier_fit_time_s = float(state["fit_time_s"])
        if "steps_timing" in state:  # checkpoints written before steps were timed have none
            self._earlier_steps = Span.from_record(state["steps_timing"])

    def steps_span(self) -> Span | None:
        """Every timed training step, earlier attempts' included (None before the first)."""
        this = self._watch.span if self._watch.span.wall_s > 0 else None
        if self._earlier_steps is None or this is None:
            return this or self._earlier_steps
        return self._earlier_steps.plus(this)

    def on_train_end(self, trainer, pl_module):
        """The run's contention verdict joins the final metrics (run.json, every logger)."""
        self._log_verdict(trainer)

    def on_fit_end(self, trainer, pl_module):
        # A run resumed from a checkpoint already at trainer.max_steps skips Lightning's training loop and
        # with it on_train_end: the verdict its earlier attempts measured is logged here, at the same step.
        if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
            self._log_verdict(trainer)

    def _log_verdict(self, trainer) -> None:
        steps = self.steps_span()
        if steps is None or self._verdict_logged:
            return
        self._verdict_logged = True
        metrics = {"train/contended": float(steps.contended), "train/cpu_share": steps.cpu_share, "train/load_start": steps.load_start,
                   "train/load_end": steps.load_end, "train/machine_cores": float(steps.machine_cores)}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        trainer.callback_metrics.update({name: torch.tensor(value) for name, value in metrics.items()})

    def summary(self) -> dict:
        """Measured run totals over the steps of every attempt that reached a checkpoint (empty before the first step)."""
        if not self.total_tokens:
            return {}
        return {
            "train_tokens": self.total_tokens,
            "train_time_s": self.total_step_time_s,
            "train_tokens_per_s": self.total_tokens / max(self.total_step_time_s, 1e-9),
            "fit_time_s": self._fit_time_s(),
            **self.cpu_summary(),
        }

    def cpu_summary(self) -> dict:
        """CPU time beside wall time over the training steps, threads, cores, load and the contention flag."""
        steps = self.steps_span()
        if steps is None:
            return {}
        return {"train_thread_cpu_s": steps.thread_cpu_s, "train_process_cpu_s": steps.process_cpu_s,
                "train_tokens_per_cpu_s": self.total_tokens / max(steps.thread_cpu_s, 1e-9), "train_cpu_share": steps.cpu_share,
                "train_threads": steps.threads, "train_cores": steps.cores, "train_machine_cores": steps.machine_cores,
                "train_load_start": steps.load_start, "train_load_end": steps.load_end, "train_contended": steps.contended,
                "train_device": steps.device}

    def _fit_time_s(self) -> float:
        this_attempt = self._fit_end - self._fit_start if self._fit_start is not None and self._fit_end is not None else 0.0
        return self._earlier_fit_time_s + this_attempt

    @staticmethod
    def _synchronize(pl_module) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)

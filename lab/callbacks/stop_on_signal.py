"""SIGTERM (a scheduler's preemption) and SIGINT (Ctrl-C) stop training at the next step boundary.

Once training starts, both signals only set a flag (a second Ctrl-C interrupts at once). At
the end of each training step the ranks agree whether any of them was signalled
(`reduce_boolean_decision`, a no-op on one process), so every rank stops after the same step.
`RecordedCheckpoint` then writes `last.ckpt` for that step the way it writes any step
checkpoint (after the validation that may follow the step), and this callback raises
`RunInterrupted` when the next step would start, once that step's rows and checkpoint are on
disk. lab/train.py records the attempt `interrupted` with the step reached and exits with
128 + the signal's number (143, 130), the code a shell gives a process a signal ended.

Lightning's own SIGTERM handling is replaced while training: it stops inside a validation
(losing that validation's rows) and before the checkpoint of the step reached. A signal that
arrives after the last step (during the final validation or decoding evaluation) stops
nothing: the run is complete, finishes `ok`, and its attempt's `late_signal` in run.json says so; a second
signal there is noted once on stderr and raises nothing either (the evaluation is bounded by its budget).
Before the last step a second Ctrl-C interrupts at once; Lightning then exits with status 1, which
lab/train.py records as `interrupted` with exit 130 instead.
"""

from __future__ import annotations

import signal
import sys
import threading

import pytorch_lightning as pl

from lab.errors import RunInterrupted


LATE_AGAIN = ("training is complete; the end-of-run evaluation finishes within its own budget (callbacks.decoding.budget_s) "
              "and the run ends ok. kill -9 stops it at once: the last checkpoint is complete, and ckpt_path=last then runs "
              "only the evaluation")


class StopOnSignal(pl.Callback):
    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal received
        self.stopping = False  # the ranks agreed to stop after the current step
        self.told_late = False

    def on_train_start(self, trainer, pl_module) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers; Lightning's own SIGTERM handling stays

        def stop(signum, frame) -> None:
            late = trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step
            if late and self.signum is not None:  # a second signal after the last step: said once, still not raised
                if not self.told_late:
                    print(f"note: {LATE_AGAIN}", file=sys.stderr, flush=True)
                self.told_late = True
            if self.signum is None:
                self.signum = signum
            if signum == signal.SIGINT and not late:
                signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C interrupts at once

        # Lightning's teardown puts back the handlers that were there before the Trainer started.
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.stopping = bool(trainer.strategy.reduce_boolean_decision(self.signum is not None, all=False))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.stopping:
            raise self.interrupted(trainer)

    def interrupted(self, trainer) -> RunInterrupted:
        return RunInterrupted(self.signum or signal.SIGTERM, trainer.global_step)

    def late_signal_note(self, trainer) -> str | None:
        """After a fit that ran to its end: why a signal received after the last step stopped nothing (None: no signal)."""
        if self.signum is None:
            return None
        name = signal.Signals(self.signum).name
        return f"{name} arrived after the last step (step {trainer.global_step}); the run had done all its work and finished it"


def stop_requested(trainer) -> bool:
    """Whether training stops after the current step (checkpoint callbacks run after StopOnSignal's hook)."""
    return any(isinstance(callback, StopOnSignal) and callback.stopping for callback in trainer.callbacks)

"""SIGTERM and Ctrl-C before training starts: one line, exit 143 / 130, nothing half-written.

Start-up can take long on its own — converting a GGUF, tokenizing a corpus, writing generated rows
(hours for a big corpus), building the hidden-state cache. Python's defaults there are a traceback
(SIGINT) or a silent death leaving a run folder without run.json (SIGTERM). While `start_up()` is
active both signals raise `StartUpInterrupted` instead: each cache writer removes its own partial
folder on the way out (they are written under a temporary name and renamed when complete), and
lab/train.py removes a run folder this attempt made (nothing was trained in it), or leaves an
existing run's record as it was, then prints one `interrupted:` line and exits 128 + the signal.
Training installs its own handlers (lab/callbacks/stop_on_signal.py): stop after the current step.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator


SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StartUpInterrupted(BaseException):
    """Stopped by `signum` before training began. A BaseException, as KeyboardInterrupt is: the readers of corpora and
    GGUF files that turn any Exception into a one-line input error must not turn a stop into one."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        super().__init__(f"stopped by {signal.Signals(self.signum).name} during start-up, before training began")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def ignore_signals() -> None:
    """While a stop cleans up (the new run folder, wandb): a second Ctrl-C must not interrupt the cleanup."""
    for number in SIGNALS:
        signal.signal(number, signal.SIG_IGN)


@contextlib.contextmanager
def start_up() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise StartUpInterrupted (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame) -> None:
        ignore_signals()  # a second signal while the first unwinds: ignored, the stop is under way
        raise StartUpInterrupted(signum)

    previous = {number: signal.signal(number, interrupt) for number in SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


SIGINT_WHILE_IMPORTING: list[int] = []  # a Ctrl-C before the pre-flight checks ended (see `stop_if_ctrl_c_was_swallowed`)


def quiet_ctrl_c_while_importing(command: str) -> None:
    """A Ctrl-C that reaches no handler (while the program still imports torch, Hydra, ...): one line and exit 130
    instead of Python's traceback and death by SIGINT. Installed only by the command's own module when it runs
    as the program; every other exception keeps Python's report. The Ctrl-C is also remembered: a library that
    swallows the KeyboardInterrupt during its import (a bare `except:` around an optional import) cannot lose it."""
    previous = sys.excepthook

    def hook(kind, value, traceback) -> None:
        if not issubclass(kind, KeyboardInterrupt):
            previous(kind, value, traceback)
            return
        interrupted_while_importing(command)

    sys.excepthook = hook
    signal.signal(signal.SIGINT, remember_ctrl_c)


def remember_ctrl_c(signum, frame) -> None:
    """Python's own SIGINT behaviour (a KeyboardInterrupt) that also leaves a mark."""
    SIGINT_WHILE_IMPORTING.append(signum)
    raise KeyboardInterrupt


def interrupted_while_importing(command: str) -> None:
    print(f"interrupted: {command} stopped by SIGINT during start-up, before training began; nothing was written",
          file=sys.stderr, flush=True)
    os._exit(128 + signal.SIGINT)


def stop_if_ctrl_c_was_swallowed(command: str) -> None:
    """After the imports and pre-flight checks: a Ctrl-C that arrived meanwhile stops the program here even when the
    code it interrupted swallowed the KeyboardInterrupt; Python's own handler takes Ctrl-C back from here on."""
    if SIGINT_WHILE_IMPORTING:
        interrupted_while_importing(command)
    if signal.getsignal(signal.SIGINT) is remember_ctrl_c:
        signal.signal(signal.SIGINT, signal.default_int_handler)

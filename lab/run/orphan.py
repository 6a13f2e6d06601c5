"""A sweep job in a launcher's worker process stops when the launcher dies.

joblib's loky workers outlive a SIGKILLed `lab-train -m`: they went on training their jobs
for minutes, holding the dead command's stdout and stderr open, and loky's resource tracker
with them. A job that runs in a worker process (one started by `multiprocessing`/loky: it has
a parent process object) watches its parent's pid. Once the worker is orphaned:
- between jobs (idle in loky's pool) it exits at once: nothing of a run is open;
- in a job it sends itself SIGTERM, which ends the job the way a scheduler's preemption does
  (lab/callbacks/stop_on_signal.py: stop after the current step, checkpoint, record `interrupted`;
  lab/run/startup_signals.py before training), and exits as soon as the job has returned — loky
  would keep the worker alive after it — or after `GRACE_S` whatever it was doing.
The kernel gives the resource tracker its end-of-file once no worker is left, and it exits too.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time

POLL_S = 0.5
GRACE_S = 60.0  # for the interrupted step's checkpoint and run.json; then the worker exits regardless
_watching: list[threading.Thread] = []
_job_running = threading.Event()


@contextlib.contextmanager
def running_job():
    """Marks the block as a job in progress: an orphaned worker lets it stop cleanly, an idle one just exits."""
    _job_running.set()
    try:
        yield
    finally:
        _job_running.clear()


def stop_when_orphaned() -> None:
    """In a launcher's worker process: start (once) the thread that ends this process when its parent dies."""
    if multiprocessing.parent_process() is None or _watching:
        return  # the main process (basic launcher, a single run): nothing launched it that could die first
    parent = os.getppid()
    watcher = threading.Thread(target=_watch, args=(parent,), name="stop-when-orphaned", daemon=True)
    _watching.append(watcher)
    watcher.start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    if _job_running.is_set():
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while _job_running.is_set() and time.monotonic() < deadline:
            time.sleep(0.1)
    os._exit(128 + signal.SIGTERM)

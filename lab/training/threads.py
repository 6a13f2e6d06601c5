"""`trainer.threads`: how many intra-op threads torch computes with.

Why a policy: on a shared machine, torch's default (one thread per core) makes every matrix product
wait for its slowest thread. When other processes hold the cores, each product waits on a thread
the scheduler has parked: measured on 2 cores at load 8–20, a d=96 model trained at 55–330 tokens/s
with 2 threads and ~1,000 with 1. A small model gains little from a second thread even on an idle
machine (its products are too small to split well), so:

    auto:    small model (< SMALL_MODEL_PARAMS parameters)  → 1 thread
             otherwise                                       → the cores free now: cores − load, at least 1
    an int:  exactly that many

The choice is made once per run, said in one console line and recorded in run.json (`threads`).
Results do not depend on the load: a small model always gets one thread, so a sweep run on a busy
machine reproduces the idle run's numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

AUTO = "auto"
SMALL_MODEL_PARAMS = 20_000_000


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    setting: str  # "auto" or the number given
    reason: str

    def record(self) -> dict:
        return {"setting": self.setting, "threads": self.threads, "reason": self.reason}


def check_threads(setting) -> None:
    from lab.errors import require

    ok = setting == AUTO or (isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1)
    require(ok, "trainer.threads", f"must be 'auto' or an integer ≥ 1 (intra-op threads), got {setting!r}")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def choose_threads(setting, n_parameters: int) -> ThreadChoice:
    check_threads(setting)
    if setting != AUTO:
        return ThreadChoice(int(setting), str(setting), "set in trainer.threads")
    cores = usable_cores()
    if n_parameters < SMALL_MODEL_PARAMS:
        return ThreadChoice(1, AUTO, f"a small model ({n_parameters / 1e6:.2f} M parameters < {SMALL_MODEL_PARAMS / 1e6:g} M) "
                                     "gains little from more, and extra threads wait on each other when the machine is shared")
    load = os.getloadavg()[0]
    free = max(1, min(cores, int(cores - load + 0.5)))
    return ThreadChoice(free, AUTO, f"{free} of {cores} cores free (1-min load {load:.1f})")


def apply_threads(choice: ThreadChoice) -> None:
    import torch

    torch.set_num_threads(choice.threads)

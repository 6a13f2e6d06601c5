"""`trainer.threads`: how many intra-op threads torch computes with.

Why a policy: on a shared machine, torch's default (one thread per core) makes every matrix product
wait for its slowest thread. When other processes hold the cores, each product waits on a thread
the scheduler has parked: measured on 2 cores at load 8–20, a d=96 model trained at 55–330 tokens/s
with 2 threads and ~1,000 with 1. On an idle machine the same model trains ~1.7× faster with 2
threads than with 1. So:

    auto:    the cores free when the run starts (cores − the cores other processes keep busy), at least 1
    an int:  exactly that many

"Free" is sampled, not read off the load average: over SAMPLE_S seconds, the share of the machine's
CPU time that other processes used (/proc/stat less this process). The 1-minute load average lags:
in a sweep it still counts the job that just ended, and would give the next job one thread on an
idle machine. The choice is made once per run, said in one console line and recorded in run.json
(`threads`). It does not change results: torch's CPU kernels here split work by output, not by
reduction, so 1 and 2 threads train bit for bit alike (tests/test_threads.py checks it), and a sweep
run beside other work reproduces the idle run's numbers.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    setting: str  # "auto" or the number given
    reason: str

    def record(self) -> dict:
        return {"setting": self.setting, "threads": self.threads, "reason": self.reason}


def check_threads(setting) -> None:
    from lab.errors import require
    from lab.errors import is_int

    ok = setting == AUTO or (is_int(setting) and setting >= 1)
    require(ok, "trainer.threads", f"must be 'auto' or an integer ≥ 1 (intra-op threads), got {setting!r}")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def choose_threads(setting) -> ThreadChoice:
    check_threads(setting)
    if setting != AUTO:
        return ThreadChoice(int(setting), str(setting), "set in trainer.threads")
    cores = usable_cores()
    busy = busy_cores_elsewhere()
    free = max(1, min(cores, cores - int(busy + 1 - BUSY_CORE)))  # a core counts as taken from BUSY_CORE of it on
    return ThreadChoice(free, AUTO, f"{free} of {cores} cores free (other processes busy on {busy:.1f} cores over {SAMPLE_S} s)")


SAMPLE_S = 0.3
BUSY_CORE = 0.75  # another process using this share of a core over the sample takes that core (a brief blip does not)


def busy_cores_elsewhere() -> float:
    """How many cores other processes kept busy over the last SAMPLE_S seconds (the load average where /proc is absent)."""
    try:
        before, own_before = machine_jiffies(), own_cpu_s()
        time.sleep(SAMPLE_S)
        after, own_after = machine_jiffies(), own_cpu_s()
    except OSError:
        return os.getloadavg()[0]
    busy, total = after[0] - before[0], after[1] - before[1]
    machine = os.cpu_count() or 1
    used = busy / total * machine * SAMPLE_S if total else 0.0  # core-seconds over the sample, every process
    return max(0.0, (used - (own_after - own_before)) / SAMPLE_S)


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine since boot, from /proc/stat's first line."""
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def own_cpu_s() -> float:
    return time.process_time()


def apply_threads(choice: ThreadChoice) -> None:
    import torch

    torch.set_num_threads(choice.threads)

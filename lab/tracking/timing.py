"""Measured time that says whether the machine let the job run: wall and CPU time, threads, load.

A time taken on a shared machine measures the other work there as much as the job. So every timed
span of a run (training steps, each decoding request) keeps, beside its wall time:

    thread_cpu_s    CPU time of the thread doing the work (time.thread_time): a thread that waits
                    for a core accrues none, so this stays the job's cost when the machine is busy
    process_cpu_s   CPU time of the whole process (every intra-op thread; time.process_time)
    threads         torch's intra-op threads; cores: the cores this process may run on
    load_start/end  the machine's 1-minute load average when the span began and ended

One rule, stated here once, says whether a span was **contended**:

    cpu_share = thread_cpu_s / wall_s  <  CPU_SHARE_MIN                (the worker waited for a core), or
    threads > 1  and  min(load_start, load_end)  >  LOAD_PER_CORE_MAX × machine cores
                                                   (more runnable work than cores, at both ends of the span)

The worker thread of an idle CPU job gets ≥ 0.95 of the wall time; one sharing its core with one
busy process gets ≈ 0.5. For a one-thread job that share is the whole story: if the worker got
its core, the job ran, whatever else the machine did. With several intra-op threads the worker's
share says less: waiting for a starved helper thread it spins (counted as CPU time, so its share can
look whole while the job is slowed) or sleeps (OMP_WAIT_POLICY=PASSIVE: not counted), so there an
overloaded machine (load above the core count) counts as contention too.
On a GPU the clocks are read after a CUDA synchronisation, so queued kernels are timed where
they ran; the rule is the same (a starved host thread starves the device too).
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import asdict, dataclass

import torch

CPU_SHARE_MIN = 0.8  # worker CPU time ÷ wall time below this: the worker waited for a core
LOAD_PER_CORE_MAX = 1.0  # 1-minute load average above this many per core, at both ends: an overloaded machine
RULE = (f"the worker thread's CPU time below {CPU_SHARE_MIN:g} of the wall time, or, for a job of several threads, the "
        f"load average above {LOAD_PER_CORE_MAX:g}× the core count")


# Metric and record names whose values say what the machine did, not what the model computed (times,
# throughputs, CPU shares, loads, thread and core counts, the contended flag, measured speedups):
# two runs of one config differ in exactly these. Comparisons of runs (resume = uninterrupted) skip them.
MACHINE_STATE_NAME = re.compile(
    r"(^|[/_])(time_s|tokens_per_s|tokens_per_cpu_s|thread_cpu_s|process_cpu_s|cpu_share|threads|cores|"
    r"load_start|load_end|contended|mfu|speedup(_cpu)?(_q[13])?)$")


def machine_cores() -> int:
    return os.cpu_count() or 1


def allowed_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return machine_cores()


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def is_contended(cpu_share: float, threads: int, load_start: float, load_end: float, cores: int) -> bool:
    """The rule of this module's docstring (NaN inputs never trigger it)."""
    overloaded = threads > 1 and min(load_start, load_end) > LOAD_PER_CORE_MAX * cores
    return bool(cpu_share < CPU_SHARE_MIN or overloaded)


@dataclass
class Span:
    """The sum of one or more timed intervals of one job (loads from the first start and the last stop)."""

    wall_s: float = 0.0
    thread_cpu_s: float = 0.0
    process_cpu_s: float = 0.0
    threads: int = 1
    cores: int = 1
    machine_cores: int = 1
    load_start: float = float("nan")
    load_end: float = float("nan")
    device: str = "cpu"

    @property
    def cpu_share(self) -> float:
        return self.thread_cpu_s / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def contended(self) -> bool:
        return is_contended(self.cpu_share, self.threads, self.load_start, self.load_end, self.machine_cores)

    def plus(self, other: Span) -> Span:
        """Both spans as one: times add, the loads are this one's start and the other's end."""
        return Span(self.wall_s + other.wall_s, self.thread_cpu_s + other.thread_cpu_s, self.process_cpu_s + other.process_cpu_s,
                    max(self.threads, other.threads), self.cores, self.machine_cores, self.load_start, other.load_end, self.device)

    def record(self) -> dict:
        """Plain fields for run.json / decoding.json, the derived share and flag included."""
        return {**asdict(self), "cpu_share": self.cpu_share, "contended": self.contended}

    @classmethod
    def from_record(cls, fields: dict) -> Span:
        return cls(**{name: fields[name] for name in cls.__dataclass_fields__ if name in fields})


class Stopwatch:
    """Accumulates timed intervals (e.g. every training step) of the calling thread into one Span.

    `start()` / `stop()` bracket each interval; on CUDA both synchronise the device first.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.span = Span(threads=torch.get_num_threads(), cores=allowed_cores(), machine_cores=machine_cores(), device=self.device.type)
        self._begin: tuple[float, float, float] | None = None

    def start(self) -> None:
        self._synchronize()
        if math.isnan(self.span.load_start):  # the first interval
            self.span.load_start = load_average()
        self._begin = (time.perf_counter(), time.thread_time(), time.process_time())

    def stop(self) -> Span:
        """Close the interval; returns that interval alone (the running total is `span`)."""
        self._synchronize()
        wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
        begin, self._begin = self._begin, None
        load = load_average()
        interval = Span(wall - begin[0], thread - begin[1], process - begin[2], torch.get_num_threads(), self.span.cores,
                        self.span.machine_cores, load, load, self.span.device)
        self.span = self.span.plus(interval)
        return interval

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def timed(fn, device: torch.device | str = "cpu"):
    """(fn(), its Span): one call measured on its own."""
    watch = Stopwatch(device)
    watch.start()
    result = fn()
    watch.stop()
    return result, watch.span

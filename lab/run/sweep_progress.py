"""A console line per sweep job (a Hydra callback, conf/hydra/default.yaml): `job 3/6 (head=parallel): started ·
2m 10s into the sweep · ETA 4m 20s` and `job 3/6: ok in 35.2s`.

Hydra's basic launcher prints `#2 : head=parallel` and then nothing until the sweep ends; on a shared
machine a sweep may run for an hour that way. The ETA is the mean time of the jobs finished so far
times the jobs left (the sweep plan's count, lab/report/sweep_plan.py). Launchers that run jobs in
other processes (joblib, Slurm) print the job line without an ETA.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from lab.report.sweep_plan import planned_jobs, read_plan


class SweepProgress(Callback):
    def __init__(self) -> None:
        self.total: int | None = None
        self.started: float | None = None
        self.job_started: float | None = None
        self.finished: list[float] = []

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        jobs = planned_jobs(config)
        self.total = None if jobs is None else len(jobs)
        self.started = time.monotonic()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:
            return
        self.job_started = time.monotonic()
        self.total = len(read_plan(Path(str(config.hydra.sweep.dir)))) or self.total  # the plan the grid sweeper wrote
        print(f"{self.job_name(config)}: started{self.eta()}", file=sys.stderr, flush=True)

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if self.job_started is None:
            return
        took = time.monotonic() - self.job_started
        self.finished.append(took)
        self.job_started = None
        print(f"{self.job_name(config)}: done in {clock(took)}", file=sys.stderr, flush=True)

    def job_name(self, config: DictConfig) -> str:
        number = int(config.hydra.job.num) + 1
        overrides = " ".join(config.hydra.overrides.task)
        return f"job {number}/{self.total or '?'} ({overrides})"

    def eta(self) -> str:
        if self.started is None:
            return ""
        text = f" · {clock(time.monotonic() - self.started)} into the sweep"
        if self.finished and self.total:
            left = self.total - len(self.finished)
            text += f" · ETA {clock(left * sum(self.finished) / len(self.finished))}"
        return text


def clock(seconds: float) -> str:
    """83.4 → '0:01:23'."""
    return str(timedelta(seconds=round(seconds)))

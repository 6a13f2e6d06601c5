"""The jobs a sweep plans, written when it starts (`<sweep dir>/sweep_plan.json`).

A sweep killed during job 1 leaves no folder for the jobs after it, so nothing on disk would
say they were ever meant to run. `SweepPlan` (a Hydra callback, conf/hydra/default.yaml)
writes every job's number and task overrides before the first job starts, expanded exactly as
Hydra's basic sweeper expands them (its own `split_arguments`). `lab-report` lists a planned
job without a folder as `not started`, and `lab-resume` runs it. Sweepers that choose their
jobs as they go (Optuna) have no plan to write.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

PLAN_NAME = "sweep_plan.json"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
# lab.run.grid_sweeper.GridSweeper expands like the basic sweeper; it then rewrites the plan with its mapped jobs.
SWEEPERS_EXPANDED_HERE = (BASIC_SWEEPER, "hydra_plugins.mtp_lab.grid_sweeper.GridSweeper")


def planned_jobs(config: DictConfig) -> list[list[str]] | None:
    """Every job's task overrides, in job-number order (None: not the basic sweeper, or a sweep it cannot expand here)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeper = config.hydra.sweeper
    if OmegaConf.select(sweeper, "_target_") not in SWEEPERS_EXPANDED_HERE:
        return None
    params = [f"{key}={value}" for key, value in (OmegaConf.select(sweeper, "params") or {}).items()]
    try:
        overrides = OverridesParser.create().parse_overrides([*params, *config.hydra.overrides.task])
        return [list(job) for job in BasicSweeper.split_arguments(overrides, None)[0]]
    except Exception:  # e.g. glob(): needs Hydra's config loader; the report then lists the folders only
        return None


def read_plan(sweep_dir: Path) -> list[dict]:
    """[{'num': int, 'overrides': [str]}] from the sweep's plan ([] when it has none)."""
    try:
        jobs = json.loads((Path(sweep_dir) / PLAN_NAME).read_text()).get("jobs") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [{"num": int(job["num"]), "overrides": [str(o) for o in job["overrides"]]} for job in jobs]


def write_plan(sweep_dir: Path, jobs: list[list[str]]) -> None:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    plan = {"jobs": [{"num": num, "overrides": overrides} for num, overrides in enumerate(jobs)]}
    tmp = sweep_dir / f".{PLAN_NAME}.tmp"
    tmp.write_text(json.dumps(plan, indent=2))
    os.replace(tmp, sweep_dir / PLAN_NAME)  # a killed sweep never leaves half a plan


class SweepPlan(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        jobs = planned_jobs(config)
        if jobs is not None:
            write_plan(Path(str(config.hydra.sweep.dir)), jobs)

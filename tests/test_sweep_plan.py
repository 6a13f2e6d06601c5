"""The sweep's plan (lab/report/sweep_plan.py): every job, numbered as Hydra's basic sweeper numbers them; jobs without a folder are `not started`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from lab.report.records import collect_sweep
from lab.report.sweep_plan import BASIC_SWEEPER, PLAN_NAME, SweepPlan, planned_jobs
from tests.cli import SUBPROCESS_TIMEOUT

REPO = Path(__file__).resolve().parents[1]


def multirun_config(sweep_dir: Path, task: list[str], params: dict | None = None, sweeper: str = BASIC_SWEEPER):
    return OmegaConf.create({"hydra": {"sweeper": {"_target_": sweeper, "params": params}, "overrides": {"task": task},
                                       "sweep": {"dir": str(sweep_dir)}}})


def test_the_plan_expands_sweeps_in_the_basic_sweepers_job_order(tmp_path):
    config = multirun_config(tmp_path, ["head=ntp,linear", "trainer.max_steps=5"], params={"seed": "0,1"})
    assert planned_jobs(config) == [  # the config's params first, the last sweep varies fastest (itertools.product)
        ["seed=0", "head=ntp", "trainer.max_steps=5"], ["seed=0", "head=linear", "trainer.max_steps=5"],
        ["seed=1", "head=ntp", "trainer.max_steps=5"], ["seed=1", "head=linear", "trainer.max_steps=5"],
    ]
    assert planned_jobs(multirun_config(tmp_path, ["seed=0,1"], sweeper="hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper")) is None


def test_planned_jobs_without_a_folder_are_listed_not_started_and_lab_resume_would_start_them(tmp_path):
    sweep = tmp_path / "sweep"
    SweepPlan().on_multirun_start(multirun_config(sweep, ["head=ntp,linear", "head.k=1"]))
    assert json.loads((sweep / PLAN_NAME).read_text())["jobs"][1] == {"num": 1, "overrides": ["head=linear", "head.k=1"]}
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    records = collect_sweep(sweep).records
    assert [(r["job"], r["status"]) for r in records] == [(0, "not started"), (1, "not started")]
    dry = subprocess.run([sys.executable, "-m", "lab.run.resume", "--dry-run", str(sweep)], env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert f"0 unfinished or failed job(s) in {sweep}; 2 not started" in dry.stdout
    assert f"hydra.run.dir={sweep.resolve()}/1-head:linear" in dry.stdout and "hydra.job.num=1" in dry.stdout, dry.stdout  # as the grid sweeper names it

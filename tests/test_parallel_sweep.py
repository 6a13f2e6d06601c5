"""The default multirun launcher (conf/hydra/launcher/parallel.yaml): jobs side by side, one per usable core, each small
job on one thread, no progress bars; sweeps of multi-process jobs are refused before anything starts."""

from __future__ import annotations

import json

import pytest
import yaml

from lab.training.threads import usable_cores
from tests.cli import TINY, lab_train, lab_train_in_process, run_module


def test_a_sweep_runs_one_job_per_core_side_by_side_each_on_one_thread(tmp_path, cache_dir):
    result = lab_train("-m", *TINY, "head=ntp,parallel", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (multirun,) = tmp_path.glob("multirun/*/*/multirun.yaml")
    assert "JoblibLauncher" in yaml.safe_load(multirun.read_text())["hydra"]["launcher"]["_target_"]
    assert f"Joblib.Parallel(n_jobs={usable_cores()}," in result.stdout + result.stderr  # Hydra's line, with the resolved count
    records = [json.loads(path.read_text()) for path in multirun.parent.glob("*/run.json")]
    assert len(records) == 2 and all(r["threads"]["threads"] == 1 and r["numerics"]["threads"] == 1 for r in records)
    assert "\r" not in result.stdout + result.stderr  # no progress bars: side by side they would interleave


def test_a_sweep_of_multi_process_jobs_is_refused_naming_the_launcher(tmp_path, cache_dir):
    result = lab_train_in_process("-m", *TINY, "trainer=ddp_cpu", "head=ntp,parallel", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: hydra/launcher: a sweep of multi-process jobs") and "hydra/launcher=basic" in result.stderr
    assert not (tmp_path / "multirun").exists()


@pytest.mark.slow  # a sweep killed mid-run, then lab-resume: ~40 s
def test_a_job_killed_inside_the_parallel_launcher_ends_the_sweep_in_one_line_and_lab_resume_finishes_it(tmp_path, cache_dir):
    """SIGKILL of one job's process (what the kernel's OOM killer does) takes its loky worker down: joblib's traceback
    before; now one line naming lab-resume, exit 1, and lab-resume brings every job to ok."""
    sweep = tmp_path / "sweep"
    tiny = [o for o in TINY if not o.startswith("trainer.max_steps")]
    overrides = ["-m", *tiny, "trainer.max_steps=6", "+callbacks.chaos._target_=tests.chaos_hooks.KillAt", "seed=0,1,2",
                 f"hydra.sweep.dir={sweep}"]
    killed = lab_train(*overrides, cache_dir=cache_dir, cwd=tmp_path, env={"MTP_LAB_KILL_AT": "batch_end@3", "MTP_LAB_KILL_DIR": "1-seed:1"})
    assert killed.returncode == 1 and "Traceback" not in killed.stderr, killed.stderr[-3000:]
    last = killed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: hydra/launcher: a job's process was killed (SIGKILL(-9)") and f"`lab-resume {sweep}`" in last, last
    resumed = run_module("lab.run.resume", str(sweep), cache_dir=cache_dir, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(json.loads(p.read_text())["status"] for p in sweep.glob("*/run.json")) == ["ok", "ok", "ok"]

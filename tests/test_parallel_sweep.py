"""The default multirun launcher (conf/hydra/launcher/parallel.yaml): jobs side by side, one per usable core, each small
job on one thread, no progress bars; sweeps of multi-process jobs are refused before anything starts."""

from __future__ import annotations

import json

import yaml

from lab.training.threads import usable_cores
from tests.cli import TINY, lab_train, lab_train_in_process


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

"""Grids across head families (lab/run/grid_sweeper.py) and job folders that name their settings (lab/run/job_folder.py)."""

from __future__ import annotations

import csv
import itertools

from lab.run.grid_sweeper import map_grid
from lab.run.job_folder import job_settings
from tests.cli import TINY, lab_train


def grid(heads, ks, seeds) -> list[list[str]]:
    return [[f"head={h}", f"head.k={k}", f"seed={s}"] for h, k, s in itertools.product(heads, ks, seeds)]


def test_ntp_keeps_its_one_horizon_deepseek_derives_its_depth_and_duplicates_run_once():
    kept, notes = map_grid(grid(["ntp", "parallel", "deepseek"], [2, 4], [0, 1]))
    assert len(kept) == 10  # 12 grid points, ntp's head.k=4 pair is its head.k=2 pair
    assert kept[:2] == [["head=ntp", "seed=0"], ["head=ntp", "seed=1"]]
    assert ["head=parallel", "head.k=4", "seed=1"] in kept
    assert ["head=deepseek", "head.k=4", "seed=0", "head.depth=3"] in kept and ["head=deepseek", "head.k=2", "seed=1", "head.depth=1"] in kept
    assert "sweep grid: head=ntp head.k=2 seed=0: head.k=2 dropped (ntp fixes K = 1)" in notes
    assert "sweep grid: head=deepseek head.k=4 seed=0: + head.depth=3 (from head.k=4)" in notes
    assert "sweep grid: head=ntp head.k=4 seed=1 is job 1 (head=ntp seed=1) after mapping: not run again" in notes


def test_a_grid_without_head_k_or_with_an_explicit_depth_is_left_as_given():
    jobs = [["head=deepseek", "head.depth=2", "seed=0"], ["head=parallel", "seed=0"]]
    assert map_grid(jobs) == (jobs, [])


def test_a_job_folder_names_the_settings_that_vary():
    jobs = [["head=parallel", "head.k=4", "seed=0", "data.path=/a b/c"], ["head=parallel", "head.k=2", "seed=0", "data.path=/d"]]
    assert job_settings(jobs[0], jobs) == "k:4+path:_a_b_c"  # head and seed are the same in every job
    assert job_settings(["seed=1"], [["seed=1"]]) is None  # nothing varies: the run name stays
    clash = [["model.n_layers=2", "head.n_layers=1"], ["model.n_layers=4", "head.n_layers=2"]]
    assert job_settings(clash[0], clash) == "model.n_layers:2+head.n_layers:1"  # one short name for two keys: the full keys


def test_the_obvious_grid_runs_and_its_report_groups_variants_by_seed(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    overrides = [o for o in TINY if not o.startswith("trainer.max_steps")]
    result = lab_train("-m", "head=ntp,deepseek", "head.k=2,3", "seed=0,1", *overrides, "trainer.max_steps=3",
                       "callbacks.decoding=null", f"hydra.sweep.dir={sweep}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sweep plan: 6 jobs" in result.stderr
    folders = sorted(p.name for p in sweep.iterdir() if (p / "run.json").exists())
    assert folders == ["0-head:ntp+seed:0", "1-head:ntp+seed:1", "2-head:deepseek+k:2+seed:0+depth:1", "3-head:deepseek+k:2+seed:1+depth:1",
                       "4-head:deepseek+k:3+seed:0+depth:2", "5-head:deepseek+k:3+seed:1+depth:2"]
    with (sweep / "runs.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["head"], r["k"], r["status"]) for r in rows] == [("ntp", "1", "ok")] * 2 + [("deepseek", "2", "ok")] * 2 + [("deepseek", "3", "ok")] * 2
    table = (sweep / "report.md").read_text().split("## Variants")[1].split("\n## ")[0]
    assert sum(line.startswith("| head=") for line in table.splitlines()) == 3  # ntp, deepseek k=2, deepseek k=3: 2 seeds each
    assert "| 2 / 2 |" in table

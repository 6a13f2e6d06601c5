"""Grids across head families (lab/run/grid_sweeper.py) and job folders that name their settings (lab/run/job_folder.py)."""

from __future__ import annotations

import csv
import itertools
import json

import pytest

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


@pytest.mark.slow  # 25–50 s of one worker (tests/README.md)
def test_the_new_user_flow_a_folder_of_code_and_the_3x2x2_grid_with_humaneval_at_the_end(tmp_path, cache_dir):
    """Own code (a folder of .py, no converter), `head=ntp,parallel,deepseek head.k=2,4 seed=0,1` (no YAML written):
    10 jobs (ntp deduplicated), 5 variants × 2 seeds in the report, and each job's HumanEval in runs.csv and the report."""
    code = tmp_path / "code"
    for i in range(12):
        (code / "pkg").mkdir(parents=True, exist_ok=True)
        (code / "pkg" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x * {i} + {i * i}\n")
    sweep = tmp_path / "sweep"
    overrides = [o for o in TINY if not o.startswith(("trainer.max_steps", "data.max_docs"))]
    result = lab_train("-m", "head=ntp,parallel,deepseek", "head.k=2,4", "seed=0,1", *overrides, "trainer.max_steps=2",
                       f"data.path={code}", "data.val_fraction=0.25", "callbacks.decoding=null", "callbacks.humaneval.problems=1",
                       "callbacks.humaneval.max_new_tokens=4", f"hydra.sweep.dir={sweep}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sweep plan: 10 jobs" in result.stderr
    folders = sorted((p.name for p in sweep.iterdir() if (p / "run.json").exists()), key=lambda name: int(name.split("-")[0]))
    assert folders == ["0-head:ntp+seed:0", "1-head:ntp+seed:1", "2-head:parallel+k:2+seed:0", "3-head:parallel+k:2+seed:1",
                       "4-head:parallel+k:4+seed:0", "5-head:parallel+k:4+seed:1", "6-head:deepseek+k:2+seed:0+depth:1",
                       "7-head:deepseek+k:2+seed:1+depth:1", "8-head:deepseek+k:4+seed:0+depth:3", "9-head:deepseek+k:4+seed:1+depth:3"]
    with (sweep / "runs.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["head"], r["k"], r["status"]) for r in rows] == [
        (head, k, "ok") for head, k in [("ntp", "1"), ("parallel", "2"), ("parallel", "4"), ("deepseek", "2"), ("deepseek", "4")] for _ in "ab"]
    for folder in folders:  # every job trained on the folder's 12 files, not on the stdlib
        stats = json.loads((sweep / folder / "run.json").read_text())["corpus_stats"]
        assert stats["n_docs_train"] + stats["n_docs_val"] == 12
    assert all(r["eval/humaneval/pass@1"] == "0.0" and r["eval/humaneval/problems"] == "1.0" for r in rows)  # a toy: 0 is its answer
    report = (sweep / "report.md").read_text()
    table = report.split("## Variants")[1].split("\n## ")[0]
    assert sum(line.startswith("| head=") for line in table.splitlines()) == 5 and table.count("| 2 / 2 |") == 5
    humaneval = report.split("## HumanEval")[1].split("\n## ")[0]
    assert sum(line.startswith("| head=") for line in humaneval.splitlines()) == 5
    acceptance = report.split("## Training-time acceptance")[1].split("\n## ")[0]
    assert sum(line.startswith("| head=") for line in acceptance.splitlines()) == 4  # every variant with draft horizons

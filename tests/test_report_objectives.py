"""The sweep report's drafter-objective table: target × truncation × rollout beside live decoding and training-time τ."""

from __future__ import annotations

import pytest

from tests.cli import TINY, lab_train


@pytest.mark.slow  # 25–50 s of one worker (tests/README.md)
def test_a_sweep_over_objectives_gets_one_row_per_objective(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    overrides = [o for o in TINY if not o.startswith("trainer.max_steps")]
    result = lab_train("-m", "objective.target=data,lk", "objective.truncate=none,first_miss", "head=parallel", "head.k=3", *overrides,
                       "trainer.max_steps=3", "callbacks.decoding.prompts=1", "callbacks.decoding.new_tokens=8", "callbacks.decoding.repeats=1",
                       "callbacks.decoding.greedy=false", f"hydra.sweep.dir={sweep}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    report = (sweep / "report.md").read_text()
    table = report.split("## Drafter objectives")[1].split("\n## ")[0]
    rows = [line for line in table.splitlines() if line.startswith("| objective.")]
    objectives = sorted(line.split(" | ")[3] for line in rows)
    assert objectives == ["data, truncate first_miss, rollout teacher", "data, truncate none, rollout teacher",
                          "lk, truncate first_miss, rollout teacher", "lk, truncate none, rollout teacher"]
    assert len({line.count(" | ") for line in rows}) == 1  # every row has every column
    assert "τ (val)" in table and "P(prefix≥2) T=1" in table

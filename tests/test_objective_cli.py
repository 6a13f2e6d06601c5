"""Reduction policies through the real CLI multirun, with the per-horizon weights visible."""

import csv

import pytest

from tests.cli import TINY, lab_train, read_run


@pytest.mark.slow  # 25–45 s alone (tests/README.md)
def test_reduction_multirun_logs_coefficients_and_effective_weights(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = lab_train(
        "-m", *TINY, "reduction=sum,global,head_mean,deepseek_paper", "head=parallel", "head.k=4", "model.n_layers=5",
        "trainer.max_steps=3", f"hydra.sweep.dir={sweep}", cache_dir=cache_dir, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = sorted(d for d in sweep.iterdir() if (d / "run.json").exists())
    assert [read_run(d)["manifest"]["reduction"] for d in runs] == ["sum", "global", "head_mean", "deepseek_paper"]
    effective = {}
    for run in runs:
        assert read_run(run)["status"] == "ok"
        last = [r for r in csv.DictReader((run / "metrics.csv").open()) if r.get("train/weight_eff/h1")][-1]
        weights = [float(last[f"train/weight_eff/h{k}"]) for k in range(1, 5)]
        counts = [float(last[f"train/count/h{k}"]) for k in range(1, 5)]
        assert sum(weights) == pytest.approx(1.0, abs=1e-5)
        assert counts == sorted(counts, reverse=True)  # farther horizons have fewer valid pairs
        effective[read_run(run)["manifest"]["reduction"]] = weights
    # head_mean weighs each horizon equally (λ uniform); sum/global weigh by valid counts.
    assert effective["head_mean"] == pytest.approx([0.25] * 4, abs=1e-5)
    assert effective["sum"] == pytest.approx(effective["global"], abs=1e-6)
    assert effective["sum"][0] > effective["sum"][3]

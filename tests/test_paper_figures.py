"""Paper figures a paper can use (analysis/paper_figures.py): PNG, PDF and SVG with text kept as text, the drawn
numbers as CSV, nothing truncated, skips that say why, relabelling, figure choice, and one-line refusals."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.figures import FIGURES
from analysis.paper_data import Skipped
from analysis.paper_figures import regenerate
from lab.report.records import ReportError
from tests.cli import SUBPROCESS_TIMEOUT, one_error_line
from tests.test_report import fake_job
from tests.test_report_findings import edit_runs, sweep_of


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def svg_text(path: Path) -> str:
    return " ".join(re.findall(r"<text[^>]*>(.*?)</text>", path.read_text(), re.S))


@pytest.fixture
def sweep(tmp_path) -> Path:
    return sweep_of(tmp_path, ["ntp", "parallel", "deepseek"], seeds=3)


def test_every_drawn_figure_comes_as_png_pdf_svg_with_its_csv_and_svg_text_is_text(sweep, tmp_path):
    written = regenerate(sweep, tmp_path / "out")
    drawn = {name: paths for name, paths in written.items() if not isinstance(paths, Skipped)}
    assert set(drawn) >= {"medusa_head_accuracy", "fig2_memory", "grad_cosine_over_training", "horizon_accuracy_over_training",
                          "quality_vs_cost", "table_s5_step_time", "deepseek_lambda_effect"}
    for name, paths in drawn.items():
        suffixes = {p.suffix for p in paths}
        assert suffixes >= ({".csv", ".md", ".tex"} if name.startswith("table_") and ".png" not in suffixes else {".png", ".pdf", ".svg", ".csv"})
        if ".svg" in suffixes:
            shown = {r["variant"] for r in read_csv(tmp_path / "out" / f"{name}.csv")}
            assert all(label in svg_text(tmp_path / "out" / f"{name}.svg") for label in shown)  # searchable text, not paths
            assert b"/FontFile2" in (tmp_path / "out" / f"{name}.pdf").read_bytes()  # TrueType: the PDF's text is editable


def test_a_figures_csv_holds_the_numbers_it_draws(sweep, tmp_path):
    regenerate(sweep, tmp_path, ["medusa_head_accuracy"])
    rows = read_csv(tmp_path / "medusa_head_accuracy.csv")
    parallel = {int(r["horizon"]): float(r["acc mean"]) for r in rows if r["variant"] == "parallel"}
    assert parallel == {k: round(0.5 / k, 6) for k in range(1, 5)}  # tests/test_report.py final_value: acc/h{k} = 0.5 / k
    assert {r["n"] for r in rows} == {"3"}


def test_a_long_label_wraps_and_is_never_cut(sweep, tmp_path):
    long = "parallel heads with the head-mean reduction and a uniform schedule"
    regenerate(sweep, tmp_path, ["medusa_head_accuracy", "quality_vs_cost"], labels={"head=parallel": long})
    for name in ("medusa_head_accuracy", "quality_vs_cost"):
        text = svg_text(tmp_path / f"{name}.svg")
        assert "…" not in text and all(word in text for word in long.split()), text
        assert long in {r["variant"] for r in read_csv(tmp_path / f"{name}.csv")}


def test_figures_with_nothing_to_compare_are_skipped_with_the_reason(tmp_path):
    sweep = sweep_of(tmp_path, ["deepseek"], seeds=2)
    constant = lambda payload: None  # noqa: E731
    edit_runs(sweep, constant)
    for metrics in sweep.glob("*/metrics.csv"):  # λ a constant 1.0 at every step
        rows = read_csv(metrics)
        with metrics.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows([{**r, "train/lambda/h2": "1.0" if r["train/lambda/h2"] else ""} for r in rows])
    written = regenerate(sweep, tmp_path / "out")
    assert written["deepseek_lambda_effect"] == Skipped("λ is constant (1) in every chain run: nothing to show")
    assert written["fig2_memory"].reason.startswith("1 variant(s) with memory metrics: nothing to compare")
    assert written["reduction_weights"].reason.startswith("one reduction policy and λ schedule in this sweep")
    assert not (tmp_path / "out" / "deepseek_lambda_effect.png").exists()


def test_the_reduction_by_lambda_figure_draws_every_seed(tmp_path):
    sweep = sweep_of(tmp_path, ["parallel"], seeds=2)
    extra = [fake_job(sweep, 2 + seed, "parallel", seed) for seed in range(2)]
    for job in extra:
        overrides = job / ".hydra" / "overrides.yaml"
        overrides.write_text(overrides.read_text() + "- weights=linear_decay\n")
        payload = json.loads((job / "run.json").read_text())
        payload["overrides"].append("weights=linear_decay")
        payload["manifest"]["weights"] = {"name": "linear_decay"}
        (job / "run.json").write_text(json.dumps(payload))
    regenerate(sweep, tmp_path / "out", ["reduction_weights"])
    rows = read_csv(tmp_path / "out" / "reduction_weights.csv")
    assert {(r["weights"], r["seed"]) for r in rows} == {(w, s) for w in ("uniform", "linear_decay") for s in ("0", "1")}
    assert len(rows) == 4 * 4  # 2 variants × 2 seeds × 4 horizons


def test_step_time_uses_cpu_time_when_contended_and_refuses_without_it(sweep, tmp_path):
    edit_runs(sweep, lambda p: p["cost"].update(train_contended=True, train_tokens_per_cpu_s=500.0 if p["manifest"]["head"] == "ntp" else 250.0))
    regenerate(sweep, tmp_path / "cpu", ["table_s5_step_time"])
    rows = {r["variant"]: r for r in read_csv(tmp_path / "cpu" / "table_s5_step_time.csv")}
    assert rows["parallel"]["clock"] == "worker CPU time (contended)" and float(rows["parallel"]["step time relative to ntp"]) == 2.0
    edit_runs(sweep, lambda p: p["cost"].pop("train_tokens_per_cpu_s"))
    assert regenerate(sweep, tmp_path / "wall", ["table_s5_step_time"])["table_s5_step_time"].reason.startswith("jobs were contended")


BAD = {
    "unknown figure": (["--figures", "fig9"], "--figures: unknown fig9; allowed: " + ", ".join(FIGURES)),
    "relabel naming no variant": (["--label", "head=medusa=Medusa"], "--label: 'head=medusa' names no variant"),
    "baseline not in the sweep": (["--baseline", "head=medusa"], "--baseline: 'head=medusa' is not a variant of this sweep"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_paper_figure_input_is_one_line_exit_2_and_writes_nothing(case, sweep, tmp_path):
    args, message = BAD[case]
    out = subprocess.run([sys.executable, "-m", "analysis.paper_figures", str(sweep), "--out", str(tmp_path / "out"), *args],
                         capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert message in one_error_line(out)
    assert not (tmp_path / "out").exists()


def test_a_sweep_without_a_finished_job_is_refused(tmp_path):
    sweep = sweep_of(tmp_path, ["ntp"], seeds=1)
    edit_runs(sweep, lambda p: p.update(status="failed", error="boom"))
    with pytest.raises(ReportError, match="no finished job"):
        regenerate(sweep, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_figures_and_labels_come_from_a_yaml_file(sweep, tmp_path):
    config = tmp_path / "paper.yaml"
    config.write_text("figures: [medusa_head_accuracy]\nlabels: {head=parallel: Parallel}\n")
    out = subprocess.run([sys.executable, "-m", "analysis.paper_figures", str(sweep), "--out", str(tmp_path / "out"), "--config", str(config)],
                         capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"medusa_head_accuracy.{s}" for s in ("csv", "pdf", "png", "svg")]
    assert "Parallel" in {r["variant"] for r in read_csv(tmp_path / "out" / "medusa_head_accuracy.csv")}

"""Report figures that cannot mislead: zero-based bars, spikes found and kept off the y-range,
uninformative figures left out with a reason, failed jobs listed in the HTML (synthetic job dirs)."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import matplotlib.colors as mcolors
import pytest

from lab.report.build import build_sweep_report
from lab.report.sweep_figures import despiked_mean_curve, zero_based_ylim
from lab.report.plotting import variant_style
from lab.report.spikes import find_spikes, robust_range, running_median
from tests.cli import SUBPROCESS_TIMEOUT, command_in_process

SPIKE_JOB, SPIKE_STEP, SPIKE_VALUE, LEVEL = 1, 12, 10.0, 2.6


def write_job(sweep: Path, job: int, head: str, k: int, *, spike: bool = False, status: str = "ok", error: str | None = None) -> None:
    """A job dir as `lab-train -m` leaves it; flat training loss LEVEL, head_mean weights 1/K on every horizon."""
    run_dir = sweep / f"{job}-{head}-k{k}"
    (run_dir / ".hydra").mkdir(parents=True)
    overrides = [f"head={head}", f"head.k={k}"]
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    names = [f"train/loss/h{h}" for h in range(1, k + 1)] + [f"train/weight_eff/h{h}" for h in range(1, k + 1)]
    with (run_dir / "metrics.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["epoch", "step", *names, "val/loss"])
        writer.writeheader()
        for step in range(30):
            row = {"epoch": 0, "step": step}
            for h in range(1, k + 1):
                # a small alternating wiggle: a real curve is never exactly flat
                row[f"train/loss/h{h}"] = LEVEL + 0.1 * h + 0.01 * (step % 2)
                row[f"train/weight_eff/h{h}"] = 1.0 / k
            if spike and step == SPIKE_STEP:
                row["train/loss/h1"] = SPIKE_VALUE
            writer.writerow(row)
        writer.writerow({"epoch": 0, "step": 29, "val/loss": LEVEL + 0.1})
    payload = {"status": status, "error": error, "overrides": overrides, "run_time_s": 5.0,
               "final_metrics": {"val/loss": LEVEL + 0.1 + 0.05 * job} if status == "ok" else {},
               "manifest": {"head": head, "k": k, "reduction": "head_mean", "weights": {"name": "uniform"}, "schedule": "sequential"},
               "config": {"seed": 0, "sweep_name": "spiky"}}
    (run_dir / "run.json").write_text(json.dumps(payload))


@pytest.fixture
def spiky_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    write_job(sweep, 0, "linear", 4)
    write_job(sweep, SPIKE_JOB, "parallel", 4, spike=True)
    write_job(sweep, 2, "causal", 4, status="failed", error="FloatingPointError: non-finite loss at step 3")
    return sweep


def test_find_spikes_names_one_step_jump_and_not_the_early_descent():
    flat = [(s, 2.6 + 0.01 * (s % 2)) for s in range(30)]
    flat[12] = (12, 10.0)
    (spike,) = find_spikes(flat)
    # the window around step 12 holds four 2.6 and four 2.61 besides the spike: median 2.61 (hand-computed)
    assert spike.step == 12 and spike.value == 10.0 and spike.baseline == pytest.approx(2.61) and spike.size == pytest.approx(7.39)
    descent = [(s, 5.5 * 0.9 ** s + 2.5) for s in range(40)]  # fast monotone early descent
    assert find_spikes(descent) == []
    assert running_median([1.0, 9.0, 2.0, 3.0, 4.0], window=3) == [1.0, 2.0, 3.0, 3.0, 4.0]
    small = [(s, 2.6 + 0.001 * (s % 2)) for s in range(30)]
    small[5] = (5, 2.9)  # 0.3 nats above: below SPIKE_MIN_NATS, ordinary noise of a tiny model
    assert find_spikes(small) == []


def test_curve_range_ignores_the_spike_and_bars_start_at_zero():
    records = [{"history": {"train/loss/h1": [(s, 2.6 if s != 12 else 10.0) for s in range(30)]}}]
    steps, means, spikes = despiked_mean_curve(records, "train/loss/h1")
    assert spikes == [(12, 10.0)] and means[12] == pytest.approx(2.6) and len(steps) == 30
    low, high = robust_range(list(means) + [2.5])
    assert low == pytest.approx(2.5 - 0.005) and high == pytest.approx(2.6 + 0.005)
    assert zero_based_ylim(2.6) == pytest.approx((0.0, 2.6 * 1.18))


def test_first_variants_get_distinct_hues():
    styles = [variant_style(i) for i in range(6)]
    hues = [mcolors.rgb_to_hsv(mcolors.to_rgb(c))[0] for c, _ in styles]
    saturated = [h for (c, _), h in zip(styles, hues) if mcolors.rgb_to_hsv(mcolors.to_rgb(c))[1] > 0.2]
    assert all(abs(a - b) > 0.04 for i, a in enumerate(saturated) for b in saturated[i + 1:]), styles
    assert len({variant_style(i) for i in range(32)}) == 32


def test_report_hides_equal_weights_names_the_spike_and_lists_failures(spiky_sweep):
    report = build_sweep_report(spiky_sweep)
    names = {p.name for p in report.figures}
    assert "effective_weights.png" not in names and "horizon_loss_curves.png" in names
    assert not (spiky_sweep / "figures" / "effective_weights.png").exists()
    md = (spiky_sweep / "report.md").read_text()
    assert "Effective horizon weights by policy: not drawn (every variant weights every horizon equally (0.25)" in md
    spike_line = next(line for line in md.splitlines() if "training-loss spike" in line)
    assert spike_line.startswith("- 1 training-loss spike(s)")
    assert f"job {SPIKE_JOB} (head=parallel) `train/loss/h1` at step {SPIKE_STEP}: 10.000 (+7.290 nats over its running median 2.710)" in spike_line  # h1 sits at 2.70 / 2.71
    page = (spiky_sweep / "report.html").read_text()
    assert "<h2>Failed jobs</h2>" in page and "non-finite loss at step 3" in page.split("<h2>Failed jobs</h2>")[1]
    assert page.count('<div class="fit"><table>') == page.count('<table>') >= 3 and 'class="scroll"' not in page  # variants, cost, jobs
    assert f"step {SPIKE_STEP}: 10.000" in page


def test_lab_report_refuses_single_runs_unless_forced(tmp_path):
    outputs = tmp_path / "outputs"  # two unrelated `lab-train` runs: run folders, no multirun.yaml
    outputs.mkdir()
    write_job(outputs, 0, "ntp", 1)
    write_job(outputs, 1, "ntp", 1)
    refused = command_in_process("lab-report", str(outputs))  # in this process; the forced run below is a real one
    assert refused.returncode == 2, refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {outputs}: not a sweep directory") and "--force" in lines[0]
    assert not (outputs / "report.md").exists() and not (outputs / "runs.csv").exists()
    forced = subprocess.run([sys.executable, "-m", "lab.report.cli", str(outputs), "--force"], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert forced.returncode == 0, forced.stderr
    assert (outputs / "report.html").exists()


def test_report_run_logs_findings_and_the_html_page(spiky_sweep):
    from lab.report.build import log_report_to_wandb
    from tests.cli import wandb_history_keys

    report = build_sweep_report(spiky_sweep)
    log_report_to_wandb(report, project="mtp-lab", group="spiky", mode="offline")
    keys, records = wandb_history_keys(spiky_sweep)  # wandb's own reader on the offline run
    assert {"findings._type", "report._type", "runs._type"} <= keys  # media are flattened by the reader
    summary = {}
    for record in records:
        if record.get("type") == "summary":
            summary.update(record["summary"].get("update", {}))
    assert "training-loss spike" in summary["findings"] and summary["jobs_failed"] == 1
    saved = [f["path"] for r in records if r.get("type") == "files" for f in r["files"]["files"]]
    assert "report.html" in saved

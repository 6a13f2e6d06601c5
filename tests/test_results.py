"""results/ and `python -m analysis.results`: every marked table of the README and docs equals its record, the main job's
record is computed from a sweep's files, and a bad record is refused in one line naming its file with nothing rewritten."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.main_job_record import main_job_rows
from analysis.result_records import ROOT, load_records, stale_documents, unused_records
from lab.report.noise import ONE_SEED_SPREAD


def test_the_committed_tables_equal_the_tables_regenerated_from_their_records():
    records = load_records(ROOT / "results")
    assert records, "results/ holds no record"
    assert not stale_documents(records), "a document's table differs from its record: run python -m analysis.results"
    assert not unused_records(records), "a record no document shows"


def test_the_reports_one_seed_floor_is_the_recorded_spread():
    record = json.loads((ROOT / "results" / "main_job_spread.json").read_text())
    losses = [float(row[3]) for row in record["rows"]]
    assert record["spread"] == pytest.approx(max(losses) - min(losses), abs=5e-5)
    assert ONE_SEED_SPREAD == pytest.approx(record["spread"], abs=5e-5)


def test_the_main_job_rows_are_means_and_sample_sds_over_seeds():
    jobs = [{"head": head, "val/loss": loss, "params_total": "690000", "train_flops_per_token": "5010000", "baseline": head == "ntp"}
            for head, loss in [("linear", "3.00"), ("ntp", "2.70"), ("ntp", "2.80"), ("linear", "3.20")]]
    rows = main_job_rows(jobs)
    # ntp: mean 2.75, sd √((0.05² + 0.05²)/1) = 0.0707; linear: mean 3.10, sd 0.1414, +0.35 to ntp; pooled sd
    # √((0.005 + 0.02)/2) = 0.1118, floor 2·0.1118·√(1/2 + 1/2) = 0.2236 < 0.35
    assert rows[0][:4] == ["`ntp`", "2.7500 ± 0.0707", "—", "2"]
    assert rows[1][:4] == ["`linear`", "3.1000 ± 0.1414", "+0.3500 (clears 0.224)", "2"]


def record(**changes) -> dict:
    base = {"id": "demo", "title": "t", "command": "lab-train head=parallel", "commit": "0" * 40, "date": "2026-12-07",
            "machine": "m", "provenance": "p", "columns": ["a", "b"], "rows": [["1", "2"]]}
    return {**base, **changes}


def checkout(tmp_path: Path, demo: dict) -> Path:
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "demo.json").write_text(json.dumps(demo))
    (tmp_path / "README.md").write_text("intro\n<!-- results:demo -->\nold table\n<!-- /results -->\nend\n")
    return tmp_path


def run_results(root: Path, *args: str, in_a_process: bool = False) -> subprocess.CompletedProcess:
    """`python -m analysis.results --root ROOT ARGS`: in this process (its `main`, stdout/stderr captured), or as a real
    process (one case per kind, for what only a process shows)."""
    argv = ["--root", str(root), *args]
    if in_a_process:
        return subprocess.run([sys.executable, "-m", "analysis.results", *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    import contextlib
    import io

    from analysis.results import main

    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as stop:
            code = int(stop.code or 0)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def test_a_table_is_rewritten_from_its_record_and_then_checks_clean(tmp_path):
    root = checkout(tmp_path, record())
    assert run_results(root, "--check").returncode == 1
    assert run_results(root).returncode == 0
    text = (root / "README.md").read_text()
    assert "| a | b |\n|---|---|\n| 1 | 2 |\n" in text and "old table" not in text and text.endswith("<!-- /results -->\nend\n")
    assert run_results(root, "--check").returncode == 0


@pytest.mark.parametrize("demo, said", [
    (record(command="lab-train head=no_such_head"), "no longer composes"),
    (record(command="python -m experiments.benchmarks.no_such_benchmark"), "does not exist"),
    ({k: v for k, v in record().items() if k != "commit"}, "missing commit"),
    (record(rows=[["1"]]), "do not have the 2 columns"),
])
def test_a_bad_record_is_refused_in_one_line_naming_its_file_and_nothing_is_rewritten(tmp_path, demo, said):
    root = checkout(tmp_path, demo)
    before = (root / "README.md").read_text()
    out = run_results(root, in_a_process="composes" in said)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert out.stderr.startswith(f"error: {root / 'results' / 'demo.json'}: ") and said in out.stderr
    assert (root / "README.md").read_text() == before


def test_a_marker_naming_no_record_is_refused(tmp_path):
    root = checkout(tmp_path, record())
    (root / "README.md").write_text("<!-- results:nowhere -->\n<!-- /results -->\n")
    out = run_results(root, "--check")
    assert out.returncode == 2 and "results/nowhere.json does not exist" in out.stderr


def test_a_main_job_record_needs_a_finished_sweep(tmp_path):
    with (tmp_path / "runs.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, ["run_dir", "status", "head", "val/loss"])
        writer.writeheader()
        writer.writerow({"run_dir": "0-head:ntp", "status": "failed", "head": "ntp", "val/loss": ""})
    out = run_results(tmp_path, "--record-main-job", str(tmp_path))
    assert out.returncode == 2 and "jobs not ok: ['0-head:ntp']" in out.stderr and not (tmp_path / "results").exists()

"""CI's summary (.ci/summary.py) over a small suite of its own: counts per phase, skip reasons, the tests no phase
selects (a failure) and the tests a budget stop left unreached (counted, not a failure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SUMMARY = Path(__file__).resolve().parents[1] / ".ci" / "summary.py"
SUITE = '''
import pytest

def test_fast(): pass

@pytest.mark.skip(reason="needs a thing this machine lacks")
def test_skipped(): pass

@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 2, 3])
def test_slow(n): pass

@pytest.mark.serial
def test_alone(): pass
'''
INI = "[pytest]\nmarkers =\n    slow: slow\n    serial: alone\naddopts = -m 'not slow and not serial' -p no:cacheprovider\n"


def run_phase(root: Path, results: Path, name: str, args: list[str], reached: bool = True) -> None:
    (results / f"{name}.args").write_text("".join(f"{a}\n" for a in args))
    if reached:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", f"--junitxml={results / name}.xml", *args],
                             cwd=root, capture_output=True, text=True)
        assert out.returncode in (0, 5), out.stdout[-2000:]


def summary(root: Path, results: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SUMMARY), str(results)], cwd=root, capture_output=True, text=True)


def suite(tmp_path: Path) -> tuple[Path, Path]:
    root, results = tmp_path / "project", tmp_path / "results"
    (root / "suite").mkdir(parents=True)
    results.mkdir()
    (root / "pytest.ini").write_text(INI)
    (root / "suite" / "test_suite.py").write_text(SUITE)
    return root, results


def test_every_phase_counted_skips_with_reasons_and_a_budget_stop_counted_not_failed(tmp_path):
    root, results = suite(tmp_path)
    run_phase(root, results, "1-default", ["suite"])
    run_phase(root, results, "2-serial", ["-m", "serial", "suite"])
    run_phase(root, results, "3-slow", ["-m", "slow", "suite"], reached=False)  # CI's budget ran out before it
    out = summary(root, results)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert "phase 1-default: 2 selected, 1 passed, 1 skipped, 0 failed, 0 not reached" in lines
    assert "phase 3-slow: 3 selected, 0 passed, 0 skipped, 0 failed, 3 not reached" in lines
    assert "  skipped 1×: needs a thing this machine lacks" in lines
    assert lines[-1] == "tests: 6 collected · 2 ran (0 failed) · 1 skipped · 0 selected by no phase · 3 not reached (CI's time budget)"


def test_a_test_no_phase_selects_fails_ci_and_is_named(tmp_path):
    """The mutation of issue 70: a phase dropped (here the serial one) leaves its tests in no phase."""
    root, results = suite(tmp_path)
    run_phase(root, results, "1-default", ["suite"])
    run_phase(root, results, "3-slow", ["-m", "slow", "suite"])
    out = summary(root, results)
    assert out.returncode == 1
    assert "  in no phase: suite/test_suite.py::test_alone" in out.stdout.splitlines()
    assert out.stdout.strip().splitlines()[-1].startswith("tests: 6 collected · 4 ran (0 failed) · 1 skipped · 1 selected by no phase")

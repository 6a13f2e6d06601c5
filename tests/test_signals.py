"""SIGTERM (preemption) and SIGINT (Ctrl-C) mid-run: exit 143 / 130, run.json `interrupted` at the
step reached with a checkpoint of that step, and a resume that ends bitwise where an
uninterrupted run ends (metrics.csv rows, final metrics, final weights)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from lab.report.records import record_from_run_dir
from tests import cli
from tests.cli import FIXED_DECODING, TINY, read_run
from lab.tracking.timing import MACHINE_STATE_NAME
from tests.test_chaos import csv_rows, row_differences

STEPS = 8
OVERRIDES = [*[o for o in TINY if not o.startswith("trainer.max_steps")], *FIXED_DECODING, f"trainer.max_steps={STEPS}",
             "callbacks.checkpoint.every_n_train_steps=100", "+callbacks.signal._target_=tests.chaos_hooks.SignalAt"]


def lab_train(run_dir: Path, cwd: Path, cache_dir: Path, *extra: str, signal_at: str = "", where: str = "batch_end", times: int = 1) -> subprocess.CompletedProcess:
    """A foreground-like job: its own process group, which SIGINT (Ctrl-C) reaches as a whole."""
    signals = {"MTP_LAB_SIGNAL_AT": signal_at, "MTP_LAB_SIGNAL_WHERE": where, "MTP_LAB_SIGNAL_TIMES": str(times)}
    return cli.lab_train(*OVERRIDES, f"hydra.run.dir={run_dir}", *extra, cache_dir=cache_dir, cwd=cwd, env=signals, start_new_session=True)


def weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow
@pytest.mark.parametrize("signum, step", [(signal.SIGTERM, 2), (signal.SIGINT, 3)], ids=["SIGTERM", "SIGINT"])  # step 3 is followed by a validation
def test_a_signalled_run_stops_at_a_checkpoint_exits_128_plus_signal_and_resumes_bitwise(tmp_path, cache_dir, signum, step):
    reference, run = tmp_path / "reference", tmp_path / "run"
    done = lab_train(reference, tmp_path, cache_dir)
    assert done.returncode == 0, done.stderr[-3000:]

    stopped = lab_train(run, tmp_path, cache_dir, signal_at=f"{signum.name}@{step}")
    assert stopped.returncode == 128 + signum, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr and f"stopped by {signum.name} at step {step}" in stopped.stderr.strip().splitlines()[-1]
    record = read_run(run)
    assert record["status"] == "interrupted" and record["attempts"][-1]["step"] == step, record["attempts"]
    assert torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["global_step"] == step
    listed = record_from_run_dir(run, tmp_path)
    assert listed["status"] == "interrupted" and f"at step {step}" in listed["error"]

    resumed = lab_train(run, tmp_path, cache_dir, "ckpt_path=last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    record = read_run(run)
    assert [a["status"] for a in record["attempts"]] == ["interrupted", "ok"] and record["attempts"][1]["resumed_from_step"] == step
    rows, reference_rows = csv_rows((run / "metrics.csv").read_text()), csv_rows((reference / "metrics.csv").read_text())
    assert rows == reference_rows, row_differences(rows, reference_rows)
    final = {name: value for name, value in record["final_metrics"].items() if not MACHINE_STATE_NAME.search(name)}
    assert final == {name: value for name, value in read_run(reference)["final_metrics"].items() if not MACHINE_STATE_NAME.search(name)}
    expected, got = weights(reference), weights(run)
    assert expected.keys() == got.keys() and all(torch.equal(expected[name], got[name]) for name in expected)


@pytest.mark.slow
def test_sigterm_during_the_final_validation_finishes_ok_and_the_record_says_the_work_was_complete(tmp_path, cache_dir):
    """Issue 38: it exited 0 with status `ok` and nothing said a signal came."""
    run = tmp_path / "run"
    out = lab_train(run, tmp_path, cache_dir, signal_at=f"SIGTERM@{STEPS}", where="validation")
    assert out.returncode == 0, out.stderr[-3000:]
    note = f"SIGTERM arrived after the last step (step {STEPS}); the run had done all its work and finished it"
    assert f"note: {note}" in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
    record = read_run(run)
    assert record["status"] == "ok" and record["attempts"][-1]["late_signal"] == note and record["attempts"][-1]["step"] == STEPS


@pytest.mark.slow
def test_two_sigints_005_s_apart_record_interrupted_and_exit_130(tmp_path, cache_dir):
    """Issue 38: exit 1, run.json `failed` (SystemExit: 1), Lightning's graceful-shutdown line last."""
    run = tmp_path / "run"
    out = lab_train(run, tmp_path, cache_dir, signal_at="SIGINT@3", times=2)
    assert out.returncode == 130, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and out.stderr.strip().splitlines()[-1].startswith(f"interrupted: {run}: stopped by SIGINT"), out.stderr[-3000:]
    record = read_run(run)
    assert record["status"] == "interrupted" and record["attempts"][-1]["status"] == "interrupted", record["attempts"]


def test_ctrl_c_while_torch_imports_exits_130_in_one_line_and_writes_nothing(tmp_path, cache_dir):
    """Issue 56: a 30-line traceback. The SIGINT goes out once torch's library is mapped into the process
    (its import under way, in the pre-flight checks): one line, 130, no run folder."""
    run_dir = tmp_path / "run"
    process = cli.start_lab_train(*OVERRIDES, f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    try:
        maps = Path(f"/proc/{process.pid}/maps")
        while process.poll() is None and "libtorch" not in maps.read_text():
            time.sleep(0.01)
        os.killpg(process.pid, signal.SIGINT)
        stderr = process.communicate(timeout=cli.SUBPROCESS_TIMEOUT)[1]
    finally:
        cli.kill_session(process)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("interrupted: "), stderr[-3000:]
    assert not run_dir.exists()


@pytest.mark.parametrize("where", ["validation", "decoding"])
def test_two_ctrl_c_after_the_last_step_finish_ok_with_the_notes(tmp_path, cache_dir, where):
    """Issue 56: two Ctrl-C during the end-of-run decoding evaluation ended in a KeyboardInterrupt traceback and
    death by the signal on one try, rc 0 without the documented note on another. After the last step every
    signal is noted and none raised: the evaluation completes, the run is ok, exit 0, both notes once."""
    run = tmp_path / "run"
    out = lab_train(run, tmp_path, cache_dir, signal_at=f"SIGINT@{STEPS}", where=where, times=2)
    assert out.returncode == 0, out.stderr[-3000:]
    late = f"note: SIGINT arrived after the last step (step {STEPS}); the run had done all its work and finished it"
    assert out.stderr.count(late) == 1 and out.stderr.count("note: training is complete; the end-of-run evaluation") == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    record = read_run(run)
    assert record["status"] == "ok" and "decode/tokens_per_forward" in json.dumps(record["final_metrics"]), record["final_metrics"]

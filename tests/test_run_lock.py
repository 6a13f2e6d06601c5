"""One process per run or sweep directory (lab/run/lock.py): a second `lab-train` or `lab-resume` stops in one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import pytorch_lightning as pl

from lab.errors import ConfigError
from lab.run.lock import LOCK_NAME, lock_directory, unlock_directory
from tests.cli import FIXED_DECODING, SUBPROCESS_TIMEOUT, TINY, cli_env, lab_train, read_run, run_module, start_lab_train, wait_for
from tests.test_chaos import csv_rows

class HoldAfterFirstStep(pl.Callback):
    """Writes `marker` after the first step and waits (up to 5 minutes) until `release` exists."""

    def __init__(self, marker: str, release: str):
        self.marker, self.release = Path(marker), Path(release)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 1:
            self.marker.write_text(str(os.getpid()))
            deadline = time.monotonic() + 300
            while not self.release.exists() and time.monotonic() < deadline:
                time.sleep(0.1)


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


@pytest.mark.slow
def test_a_second_lab_train_on_a_busy_run_dir_stops_in_one_line_and_leaves_the_first_run_alone(tmp_path, cache_dir):
    run_dir, marker, release = tmp_path / "run", tmp_path / "first-step-done", tmp_path / "release"
    hold = ["+callbacks.hold._target_=tests.test_run_lock.HoldAfterFirstStep", f"+callbacks.hold.marker={marker}", f"+callbacks.hold.release={release}"]
    first = start_lab_train(*TINY, *FIXED_DECODING, *hold, f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path, stdout=subprocess.PIPE)
    try:
        wait_for(marker, first, "the first run finished its first step")
        second = lab_train(*TINY, *FIXED_DECODING, f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    finally:
        release.write_text("go")
        _, first_err = first.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert first.returncode == 0, first_err[-3000:]
    assert second.returncode != 0
    line = one_error_line(second.stderr)
    assert line.startswith("error: hydra.run.dir:") and f"pid {first.pid} on {socket.gethostname()}" in line, line
    record = read_run(run_dir)
    assert record["status"] == "ok" and [a["status"] for a in record["attempts"]] == ["ok"], record["attempts"]
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1

    alone = tmp_path / "alone"
    single = lab_train(*TINY, *FIXED_DECODING, f"hydra.run.dir={alone}", cache_dir=cache_dir, cwd=tmp_path)
    assert single.returncode == 0, single.stderr[-3000:]
    assert csv_rows((run_dir / "metrics.csv").read_text()) == csv_rows((alone / "metrics.csv").read_text())


@contextmanager
def held_by_another_process(folder: Path):
    """A child process holding `folder`'s lock until the block ends; yields its pid."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from lab.run.lock import lock_directory; lock_directory(sys.argv[1], 'x'); print('held', flush=True); time.sleep(600)", str(folder)],
        env=cli_env(), stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_lab_resume_on_a_sweep_another_process_holds_stops_in_one_line(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    with held_by_another_process(sweep) as pid:
        out = run_module("lab.run.resume", str(sweep), cache_dir=None, cwd=tmp_path)
    assert out.returncode == 2
    line = one_error_line(out.stderr)
    assert line.startswith("error: sweep_dir:") and f"pid {pid} on {socket.gethostname()}" in line, line


def test_a_lock_left_by_a_dead_process_is_taken_over_and_a_live_one_is_refused(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / LOCK_NAME).write_text(f"pid {dead.pid} on {socket.gethostname()}\n")
    lock_directory(tmp_path, "hydra.run.dir")
    try:
        assert (tmp_path / LOCK_NAME).read_text() == f"pid {os.getpid()} on {socket.gethostname()}\n"
        lock_directory(tmp_path, "hydra.run.dir")  # the holder itself may ask again
    finally:
        unlock_directory(tmp_path)
    with held_by_another_process(tmp_path) as pid:
        with pytest.raises(ConfigError, match=f"in use by pid {pid} on "):
            lock_directory(tmp_path, "hydra.run.dir")

"""`lab-resume SWEEP_DIR`: a sweep whose second job was SIGKILLed is finished from that job's last.ckpt."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl

from tests.cli import TINY, kill_session, read_run, run_module, start_lab_train, wait_for

STEPS, KILL_AT = 8, 4


class StallOnce(pl.Callback):
    """In the `head` job only, and only the first time: once the step-`step` checkpoint is in place
    (it is published when the next step starts, issue 13), write `marker` and wait to be killed
    (a resumed run finds the marker and goes on)."""

    def __init__(self, step: int, marker: str, head: str):
        self.step, self.marker, self.head = step, Path(marker), head

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if pl_module.hparams.head["name"] == self.head and trainer.global_step == self.step + 1 and not self.marker.exists():
            self.marker.write_text(str(self.step))
            time.sleep(300)


@pytest.mark.slow
def test_lab_resume_finishes_a_sweep_with_one_killed_job(tmp_path, cache_dir):
    sweep, marker = tmp_path / "sweep", tmp_path / "stalled"
    tiny = [o for o in TINY if not o.startswith("trainer.max_steps")]
    overrides = [
        "-m", *tiny, "head=linear,parallel", "head.k=2", f"trainer.max_steps={STEPS}", f"callbacks.checkpoint.every_n_train_steps={KILL_AT}",
        "+callbacks.stall._target_=tests.test_resume_sweep.StallOnce", f"+callbacks.stall.step={KILL_AT}",
        f"+callbacks.stall.marker={marker}", "+callbacks.stall.head=parallel", f"hydra.sweep.dir={sweep}",
        "hydra/launcher=basic",  # the session killed below runs its jobs in its own process, one after another
    ]
    process = start_lab_train(*overrides, cache_dir=cache_dir, cwd=tmp_path)
    try:
        wait_for(marker, process, "job 1 reached its checkpoint")
    finally:
        kill_session(process)  # the whole sweep dies mid-job
    done, killed = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / ".hydra").exists())
    # the killed job's record still says running (issue 13: run.json is written when the attempt starts)
    assert read_run(done)["status"] == "ok" and read_run(killed)["status"] == "running" and not (sweep / "report.md").exists()
    done_record = (done / "run.json").read_bytes()

    result = run_module("lab.run.resume", str(sweep), cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"1 unfinished or failed job(s) in {sweep}" in result.stdout and f"resuming {killed.name} (running)" in result.stdout
    assert "ckpt_path=last" in result.stdout and "no checkpoint at" not in result.stderr  # it resumed, not restarted
    record = read_run(killed)
    assert record["status"] == "ok" and record["manifest"]["weight_position"]["step"] == STEPS
    assert (done / "run.json").read_bytes() == done_record  # the finished job was not run again
    assert "report: " in result.stdout and "(2 ok, 0 failed)" in result.stdout
    rows = (sweep / "runs.csv").read_text().splitlines()
    assert len(rows) == 3 and all(",ok," in row for row in rows[1:])
    assert json.loads((killed / "run.json").read_text())["overrides"][0].startswith("model.d_model")

"""Chaos soak: one run SIGKILLed at random moments, resumed after each kill, ends bitwise where an uninterrupted run ends.

The kills are not placed at named points (tests/test_chaos.py does that): each attempt is killed at a
random moment of its own progress (a random row, then a random share of a row's time), so a kill can land inside
a step, a validation, a checkpoint write or the run record's update. Every attempt after the first resumes with the
recipe of docs/resuming.md (`ckpt_path=last`). The seed of the random moments is printed, so a failure can be
replayed with MTP_LAB_SOAK_SEED.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.cli import SUBPROCESS_TIMEOUT, TINY, read_run, start_lab_train

STEPS, EVERY, KILLS = 16, 2, 4
JOB = [*[o for o in TINY if not o.startswith(("trainer.max_steps", "trainer.val_check_interval"))],
       f"trainer.max_steps={STEPS}", "trainer.val_check_interval=4", f"callbacks.checkpoint.every_n_train_steps={EVERY}"]


def start(run_dir: Path, cwd: Path, cache_dir: Path, *extra: str) -> subprocess.Popen:
    return start_lab_train(*JOB, f"hydra.run.dir={run_dir}", *extra, cache_dir=cache_dir, cwd=cwd)


def rows_logged(run_dir: Path) -> int:
    try:
        return max(0, len((run_dir / "metrics.csv").read_text().splitlines()) - 1)
    except OSError:
        return 0


def kill_at_random(process: subprocess.Popen, run_dir: Path, rng: random.Random, rows_before: int) -> bool:
    """SIGKILL `process` at a random moment of its own progress (True), or let it end first (False: it finished).

    The moment is counted in the run's rows, not in seconds, so it falls inside the run however fast the machine is
    (a fixed 0–4 s window outlasted a whole 16-step run on an idle machine): 1–4 rows after this attempt's start, plus a
    random share of the time between its last two rows, so the kill lands inside a step, a validation, a checkpoint
    write or the record's update."""
    target = rows_before + rng.randint(1, 4)
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    rows, row_seen_at, row_s = rows_before, None, 0.0
    while process.poll() is None and rows < target and time.monotonic() < deadline:
        time.sleep(0.02)
        logged = rows_logged(run_dir)
        if logged > rows:
            now = time.monotonic()
            row_s = 0.0 if row_seen_at is None else (now - row_seen_at) / (logged - rows)  # between rows of this attempt
            rows, row_seen_at = logged, now
    time.sleep(rng.uniform(0.0, row_s))
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    return True


def weights(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow  # a reference run and up to five attempts of one 16-step run: 21 min with six at load 10 on 2 cores
def test_random_sigkills_then_resumes_end_bitwise_equal_to_an_uninterrupted_run(tmp_path, cache_dir):
    seed = int(os.environ.get("MTP_LAB_SOAK_SEED", random.SystemRandom().randrange(1 << 16)))
    print(f"soak seed {seed} (replay: MTP_LAB_SOAK_SEED={seed})")
    rng = random.Random(seed)
    reference, run = tmp_path / "reference", tmp_path / "run"
    whole = start(reference, tmp_path, cache_dir)
    try:
        killed = 0
        for attempt in range(KILLS + 1):  # the attempt after the last kill runs to the end
            process = start(run, tmp_path, cache_dir, *(["ckpt_path=last"] if attempt else []))
            if attempt == KILLS or not kill_at_random(process, run, rng, rows_logged(run)):
                assert process.wait(timeout=SUBPROCESS_TIMEOUT) == 0, (seed, process.stderr.read()[-3000:])
                break
            killed += 1
        assert whole.wait(timeout=SUBPROCESS_TIMEOUT) == 0, whole.stderr.read()[-3000:]
    finally:
        if whole.poll() is None:
            whole.kill()
    assert killed >= 1, f"seed {seed}: every attempt finished before its kill; nothing was soaked"
    a, b = weights(reference), weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a), f"seed {seed}: weights differ"
    record = read_run(run)
    statuses = [attempt["status"] for attempt in record["attempts"]]
    assert record["status"] == "ok" and statuses.count("ok") == 1, (seed, statuses)
    finished = statuses.index("ok")
    # a kill can land after the run wrote "ok" (during teardown): the attempt is done, and the resume after it has nothing to do
    assert statuses[:finished] == ["interrupted"] * finished and statuses[finished + 1:] in ([], ["nothing_to_do"]), (seed, statuses)
    assert killed == len(statuses) - 1 and record["attempts"][finished]["step"] == STEPS, (seed, record["attempts"])
    assert not [p for p in run.rglob("*") if p.name.endswith((".partial", ".staged", ".tmp"))]

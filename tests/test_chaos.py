"""Chaos acceptance test: a sweep job killed five times, refused once, resumed when finished; a job never started.

Sweep A runs 3 jobs uninterrupted. Sweep B runs the same 3 jobs; job 1 is SIGKILLed by its
own process (tests/chaos_hooks.py) at five named points — after a training step, during a
validation, while a checkpoint is being written, before a staged checkpoint is renamed into
place, after the final checkpoint — and resumed after each kill with the
docs/resuming.md sweep-resume recipe. Then a resume with a wrong override is refused, and a resume of the
finished job has nothing to do. Job 2 never started (the kill stopped the sweep): the report
lists it `not started` and `lab-resume` runs it and rebuilds the report. B's report, runs.csv and every job's metrics.csv must equal
A's (time-dependent columns aside), no temp file may remain, and run.json must hold every
attempt.

Also here: a SIGKILLed joblib sweep leaves no worker or resource tracker behind, and the bad
inputs of issue 38 are refused in one line without a folder. The companions: test_chaos_soak.py
(random kills of one run, resumed to bitwise-equal weights), test_chaos_mutations.py (a random
bad-config generator over every typed field), test_signals.py (signals at the edges),
test_run_record_cli.py (finished runs, wandb online without a network, full disk, unwritable
folders) and test_report.py (concurrent reports, status counts).
"""

from __future__ import annotations

import csv
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lab.report.records import collect_sweep
from lab.tracking.timing import MACHINE_STATE_NAME
from tests.cli import FIXED_DECODING, SUBPROCESS_TIMEOUT, TINY, cli_env, read_run, run_module

STEPS, EVERY, VAL_EVERY = 12, 2, 4  # checkpoints at 2, 4, ..., validations after steps 4, 8, 12
# (point, global step): the point's step, then where the next attempt resumes from.
KILLS = [("batch_end", 3), ("validation", 4), ("checkpoint_write", 6), ("batch_start", 6), ("train_end", 12)]
KILLED_JOB = "1-seed:1"  # <job num>-<the settings that vary> (lab/run/job_folder.py): the second job of the sweep
WALL_CLOCK_HEADERS = ("time", "tokens/s", "CPU-s", "CPU share", "contended")  # columns that measure the machine
SPEED_FINDINGS = ("Speeds taken under contention", "No speed was taken under contention", "Fastest speculative decoding",
                  "No variant is ranked by decoding speed")  # findings on measured speed: which appear depends on the machine


def sweep_overrides() -> list[str]:
    tiny = [o for o in TINY if not o.startswith(("trainer.max_steps", "trainer.val_check_interval"))]
    return [
        *tiny, *FIXED_DECODING, f"trainer.max_steps={STEPS}", f"trainer.val_check_interval={VAL_EVERY}",
        f"callbacks.checkpoint.every_n_train_steps={EVERY}", "+callbacks.chaos._target_=tests.chaos_hooks.KillAt",
        "seed=0,1,2",
        "hydra/launcher=basic",  # the kills below end the sweep's own process: its jobs run in it, one after another
    ]


def env(cache_dir: Path, kill: str | None = None) -> dict:
    out = cli_env(cache_dir)
    out.pop("MTP_LAB_KILL_AT", None)
    if kill is not None:
        out.update(MTP_LAB_KILL_AT=kill, MTP_LAB_KILL_DIR=KILLED_JOB)
    return out


def sweep(sweep_dir: Path, cwd: Path, cache_dir: Path, kill: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lab.train", "-m", *sweep_overrides(), f"hydra.sweep.dir={sweep_dir}"],
        cwd=cwd, env=env(cache_dir, kill), capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT,
    )


def resume(job: Path, cwd: Path, cache_dir: Path, *extra: str, kill: str | None = None) -> subprocess.CompletedProcess:
    """The sweep-resume recipe of docs/resuming.md, verbatim (plus `extra` overrides)."""
    recipe = f"lab-train $(sed -n 's/^- //p' $JOB/.hydra/overrides.yaml) hydra.mode=RUN hydra.run.dir=$JOB ckpt_path=last {' '.join(extra)}"
    script = f"lab-train() {{ {sys.executable} -m lab.train \"$@\"; }}; JOB={job}; {recipe}"
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env(cache_dir, kill), capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)


def csv_rows(text: str) -> list[dict]:
    """Rows without the columns that measure the machine (times, throughput, load, contention): those differ between any two runs."""
    return [{k: v for k, v in row.items() if not MACHINE_STATE_NAME.search(k)} for row in csv.DictReader(io.StringIO(text))]


def row_differences(left: list[dict], right: list[dict]) -> list[tuple]:
    """(row, column, left value, right value) wherever two csv_rows lists differ: what a failed comparison prints."""
    if len(left) != len(right):
        return [("rows", len(left), len(right))]
    return [(i, key, a.get(key), b.get(key)) for i, (a, b) in enumerate(zip(left, right)) for key in sorted(a.keys() | b.keys())
            if a.get(key) != b.get(key)]


def report_text(sweep_dir: Path) -> str:
    """report.md without the sweep's own path, its measured-speed findings and the table columns that measure the machine
    (headed '... time ...', 'tokens/s', CPU time or share, contended)."""
    text = (sweep_dir / "report.md").read_text().replace(str(sweep_dir), "SWEEP")
    text = "\n".join(line for line in text.splitlines() if not any(finding in line for finding in SPEED_FINDINGS))
    text = re.sub(r"summed job run time: [0-9.]+ s", "summed job run time: T s", text)
    lines, timed = [], set()
    for line in text.splitlines():
        cells = line.split("|")
        if line.startswith("|") and not timed and any(word in line for word in WALL_CLOCK_HEADERS):
            timed = {i for i, cell in enumerate(cells) if any(word in cell for word in WALL_CLOCK_HEADERS)}
        elif not line.startswith("|"):
            timed = set()
        elif not set(line) <= set("|-: "):
            cells = [" T " if i in timed else cell for i, cell in enumerate(cells)]
        lines.append("|".join(cells))
    return "\n".join(lines)


@pytest.mark.slow
def test_killed_refused_and_finished_resumes_leave_the_sweep_records_of_an_uninterrupted_sweep(tmp_path, cache_dir):
    a, b = tmp_path / "a", tmp_path / "b"
    done = sweep(a, tmp_path, cache_dir)
    assert done.returncode == 0, done.stderr[-3000:]

    first = sweep(b, tmp_path, cache_dir, kill="%s@%d" % KILLS[0])
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]  # SIGKILL: job 1 dies, the sweep with it (no report yet)
    job = b / KILLED_JOB
    original_overrides = (job / ".hydra" / "overrides.yaml").read_text()
    listed = {r["job"]: r for r in collect_sweep(b).records}
    assert listed[1]["status"] == "interrupted" and "last logged step" in listed[1]["error"], listed[1]["error"]
    assert listed[2]["status"] == "not started" and listed[2]["overrides"][-1] == "seed=2" and not (b / "2-seed:2").exists()
    assert read_run(job)["status"] == "running" and read_run(job)["pid"] and read_run(job)["host"]

    for point, step in KILLS[1:]:
        out = resume(job, tmp_path, cache_dir, kill=f"{point}@{step}")
        assert out.returncode == 128 + signal.SIGKILL, (point, out.stderr[-3000:])  # bash reports its killed child
        if point == "checkpoint_write":
            assert list((job / "checkpoints").glob(".*.partial")), "the kill must leave an orphaned temp file"
        if point == "batch_start":
            assert list((job / "checkpoints").glob(".*.staged")), "the kill must leave an unpublished checkpoint"
    out = resume(job, tmp_path, cache_dir)
    assert out.returncode == 0, out.stderr[-3000:]

    before = {p.name: p.read_bytes() for p in [job / "run.json", job / "metrics.csv", job / "checkpoints" / "last.ckpt"]}
    refused = resume(job, tmp_path, cache_dir, "model.d_model=64")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith(
        "error: model.d_model: the run being resumed trained with"), refused.stderr[-2000:]  # the recorded config, before the checkpoint
    finished = resume(job, tmp_path, cache_dir)
    assert finished.returncode == 0 and "nothing to do" in finished.stderr, finished.stderr[-2000:]
    assert (job / "metrics.csv").read_bytes() == before["metrics.csv"]
    assert (job / "checkpoints" / "last.ckpt").read_bytes() == before["last.ckpt"]
    assert (job / ".hydra" / "overrides.yaml").read_text() == original_overrides  # no ckpt_path=last piling up

    finish = run_module("lab.run.resume", str(b), cache_dir=cache_dir, cwd=tmp_path)
    assert finish.returncode == 0 and "(3 ok, 0 failed)" in finish.stdout, finish.stdout[-2000:] + finish.stderr[-3000:]
    assert csv_rows((b / "runs.csv").read_text()) == csv_rows((a / "runs.csv").read_text()), row_differences(
        csv_rows((b / "runs.csv").read_text()), csv_rows((a / "runs.csv").read_text()))
    assert report_text(b) == report_text(a)
    for name in ("0-seed:0", KILLED_JOB, "2-seed:2"):
        rows, reference_rows = csv_rows((b / name / "metrics.csv").read_text()), csv_rows((a / name / "metrics.csv").read_text())
        assert rows == reference_rows, (name, row_differences(rows, reference_rows))
    assert not [p for p in b.rglob("*") if p.name.endswith((".partial", ".staged"))]

    record = read_run(job)
    statuses = [attempt["status"] for attempt in record["attempts"]]
    assert statuses == ["interrupted"] * 5 + ["ok", "refused", "nothing_to_do"], statuses
    assert [attempt["resumed_from_step"] for attempt in record["attempts"][:6]] == [None, 2, 2, 4, 4, 12]
    assert record["status"] == "ok" and record["final_metrics"] == record["attempts"][5]["final_metrics"]
    assert record["run_time_s"] > 0 and all(attempt["pid"] and attempt["host"] for attempt in record["attempts"])
    assert "model.d_model=64" in record["attempts"][6]["overrides"] and "model.d_model=64" not in record["overrides"]


def session_processes(sid: int) -> list[str]:
    """`pid command` of every live process in session `sid` (the launcher's, its workers, loky's resource tracker)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid=,stat=,args="], capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if line.split()[1] == str(sid) and not line.split()[2].startswith("Z")]


@pytest.mark.slow
def test_a_sigkilled_joblib_sweep_leaves_no_worker_or_resource_tracker_behind(tmp_path, cache_dir):
    """Issue 38: loky's workers and resource trackers lived on ≥ 120 s, finishing their jobs for a dead command."""
    import time

    sweep_dir = tmp_path / "sweep"
    tiny = [o for o in TINY if not o.startswith(("trainer.max_steps", "trainer.val_check_interval"))]
    argv = [*tiny, "trainer.max_steps=400", "trainer.val_check_interval=100", "seed=0,1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
            f"hydra.sweep.dir={sweep_dir}"]
    launcher = subprocess.Popen([sys.executable, "-m", "lab.train", "-m", *argv], cwd=tmp_path, env=env(cache_dir),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT
        while len(list(sweep_dir.glob("*/metrics.csv"))) < 2 and time.monotonic() < deadline:  # both jobs training
            time.sleep(0.5)
        assert len(list(sweep_dir.glob("*/metrics.csv"))) == 2, session_processes(launcher.pid)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    # Issue 56: workers lingered ~63 s (loky kept them after their job; a fixed grace then ended them). Now: half a
    # second to notice, a step to finish, its checkpoint and run.json, and the worker exits with its job.
    deadline = time.monotonic() + 15
    while session_processes(launcher.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = session_processes(launcher.pid)
    for line in left:
        os.kill(int(line.split()[0]), signal.SIGKILL)
    assert not left, left
    statuses = {job.name: read_run(job)["status"] for job in sweep_dir.glob("*-seed:*")}
    assert statuses and set(statuses.values()) == {"interrupted"}, statuses


ISSUE_38_BAD_INPUTS = [  # (overrides, field): each trained, or ended in a traceback or a second line, before issue 38
    (["optim.warmup_steps=-1"], "optim.warmup_steps"),
    (["optim.grad_clip=-1"], "optim.grad_clip"),
    (["head=identity", "head.k=3", "head.n_layers=2"], "head.n_layers"),
    (["ckpt_path={parent}/checkpoints/last.ckpt", "init_from={parent}"], "ckpt_path"),
    (["callbacks.checkpoint.every_n_train_steps=-1"], "callbacks.checkpoint.every_n_train_steps"),
    (["model.vocab_size=100"], "model.vocab_size"),
    (["data=text", "data.path={inputs}/corrupt.parquet"], "data.path"),
    (["ckpt_path={inputs}/malicious_pickle.ckpt"], "checkpoint"),
]


@pytest.mark.slow
@pytest.mark.parametrize("overrides, field", ISSUE_38_BAD_INPUTS, ids=[case[1] + ":" + case[0][-1].split("/")[-1] for case in ISSUE_38_BAD_INPUTS])
def test_the_bad_inputs_of_issue_38_are_refused_in_one_line_without_a_folder(tmp_path, cache_dir, overrides, field):
    from tests.cli import lab_train
    from tests.test_bad_inputs import assert_refused_in_one_line, write_inputs

    parent, cwd, inputs = tmp_path / "parent", tmp_path / "cwd", tmp_path / "inputs"
    write_inputs(inputs)
    if any("{parent}" in o for o in overrides):
        assert lab_train(*TINY, f"hydra.run.dir={parent}", cache_dir=cache_dir, cwd=tmp_path).returncode == 0
    cwd.mkdir()
    result = lab_train(*TINY, *[o.format(inputs=inputs, parent=parent) for o in overrides], cache_dir=cache_dir, cwd=cwd)
    assert_refused_in_one_line(result, field, cwd, set())

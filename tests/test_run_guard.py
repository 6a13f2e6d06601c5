"""RunDirGuard's note of what an attempt made or found, and `discard_new_run_dir`, across several runs in one process.

`lab-train` runs one run per process, but the in-process test runner (tests/cli.py) and any caller of the
entry point run several: a note left by an earlier run must never make a later refusal remove the wrong folder.
"""

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from lab.run.guard import RunDirGuard, discard_new_run_dir
from lab.run.lock import unlock_directory


def start(run_dir: Path, ckpt_path: str | None = None) -> None:
    """What Hydra does for a single run: the guard's on_run_start, then its own files in the run dir."""
    config = OmegaConf.create({"hydra": {"run": {"dir": str(run_dir)}, "output_subdir": ".hydra"}, "ckpt_path": ckpt_path})
    RunDirGuard().on_run_start(config)
    (run_dir / ".hydra").mkdir(exist_ok=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("[]\n")


@pytest.fixture
def runs(tmp_path):
    yield tmp_path / "outputs"
    for folder in tmp_path.rglob("*"):
        unlock_directory(folder)  # the guard's locks are per process: release them for the next test


def finish(run_dir: Path) -> None:
    (run_dir / "run.json").write_text(json.dumps({"status": "ok"}))
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"weights")


def test_a_refused_first_attempt_leaves_no_folder(runs):
    run_dir = runs / "day" / "run"
    start(run_dir)
    assert discard_new_run_dir(run_dir) and not runs.exists()  # the run dir and the parents it made


def test_a_refused_resume_after_an_earlier_run_in_this_process_keeps_the_finished_run(runs):
    """Run 1 made the folder and finished; run 2 resumes it (ckpt_path=last) and is refused before it begins."""
    run_dir = runs / "run"
    start(run_dir)
    finish(run_dir)
    start(run_dir, ckpt_path="last")
    assert not discard_new_run_dir(run_dir)
    assert (run_dir / "run.json").exists() and (run_dir / "checkpoints" / "last.ckpt").read_bytes() == b"weights"


def test_a_refused_run_in_a_users_folder_after_an_earlier_run_keeps_only_what_the_folder_held(runs):
    first = runs / "first"
    start(first)
    finish(first)
    mine = runs / "mine"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    start(mine)
    assert discard_new_run_dir(mine)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # Hydra's files and the lock gone, the user's file kept
    assert (first / "run.json").exists()


def test_only_the_folder_of_the_latest_start_is_discarded(runs):
    """An earlier start's note never answers for another folder."""
    earlier, later = runs / "earlier", runs / "later"
    start(earlier)
    start(later)
    assert not discard_new_run_dir(earlier) and earlier.is_dir()
    assert discard_new_run_dir(later) and not later.exists()

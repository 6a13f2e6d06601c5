"""trainer.threads (lab/training/threads.py): the auto policy, the free-core sample, and the run's record of it."""

from __future__ import annotations

import multiprocessing
import time

import pytest

import lab.training.threads as threads
from lab.training.threads import SMALL_MODEL_PARAMS, busy_cores_elsewhere, choose_threads


def test_a_number_wins_and_a_small_model_gets_one_thread_whatever_the_load(monkeypatch):
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda: 0.0)
    assert choose_threads(3, SMALL_MODEL_PARAMS * 10).threads == 3
    assert choose_threads("auto", SMALL_MODEL_PARAMS - 1).threads == 1


@pytest.mark.parametrize("busy, expected", [(0.0, 2), (0.4, 2), (0.6, 1), (1.7, 1), (2.0, 1)])
def test_a_large_model_gets_the_free_cores_at_least_one(monkeypatch, busy, expected):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda: busy)
    choice = choose_threads("auto", SMALL_MODEL_PARAMS)
    assert choice.threads == expected and f"busy on {busy:.1f} cores" in choice.reason


def spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def test_the_sample_sees_another_process_spinning_and_not_this_one():
    quiet = busy_cores_elsewhere()
    spinner = multiprocessing.Process(target=spin, args=(3.0,))
    spinner.start()
    try:
        time.sleep(0.3)
        loaded = busy_cores_elsewhere()
    finally:
        spinner.terminate()
    assert loaded >= quiet + 0.6  # one core kept busy by the other process (other tests may add more, never less)


def test_a_run_records_and_applies_its_choice(tiny_cfg, tmp_path):
    import torch

    from lab.run.record import RunRecord
    from lab.train import build

    record = RunRecord(tmp_path, [])
    before = torch.get_num_threads()
    try:
        build(tiny_cfg("trainer.threads=2"), record)
        assert torch.get_num_threads() == 2 and record.fields["threads"] == {"setting": "2", "threads": 2, "reason": "set in trainer.threads"}
        build(tiny_cfg(), record)
        assert torch.get_num_threads() == 1 and record.fields["threads"]["setting"] == "auto"  # a tiny model: one thread
    finally:
        torch.set_num_threads(before)

"""trainer.threads (lab/training/threads.py): the count comes from the config and the model's size, never from the
machine's load, so the main job gives the same digits idle and beside busy loops; a resume computes on its record."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch

import lab.training.threads as threads
from lab.errors import ConfigError
from lab.training.threads import SMALL_MODEL_PARAMS, choose_threads


def test_a_number_wins():
    choice = choose_threads(3, params=1_000)
    assert choice.threads == 3 and choice.reason == "set in trainer.threads"


@pytest.mark.parametrize("setting", [0, -1, 1.5, "two"])
def test_a_count_that_is_no_count_is_refused_naming_the_setting(setting):
    with pytest.raises(ConfigError, match=r"trainer\.threads.*'auto' or an integer ≥ 1"):
        choose_threads(setting, params=1_000)


def test_a_small_model_computes_on_one_thread_on_any_machine(monkeypatch):
    for cores in (1, 2, 64):
        monkeypatch.setattr(threads, "usable_cores", lambda cores=cores: cores)
        assert choose_threads("auto", params=SMALL_MODEL_PARAMS - 1).threads == 1


@pytest.mark.parametrize("cores, side_by_side, expected", [(2, 1, 2), (8, 1, 8), (8, 2, 4), (2, 4, 1)])
def test_a_large_model_shares_the_usable_cores_among_the_jobs_beside_it(monkeypatch, cores, side_by_side, expected):
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    assert choose_threads("auto", params=SMALL_MODEL_PARAMS, side_by_side=side_by_side).threads == expected


def test_a_resume_computes_on_its_recorded_count_or_is_refused_naming_both(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    assert choose_threads("auto", params=1_000, recorded=2).threads == 2  # auto would give 1 thread to a new run
    assert choose_threads(2, params=1_000, recorded=2).threads == 2
    with pytest.raises(ConfigError, match=r"trainer\.threads: the run being resumed computed on 2 threads, this resume asks for 1"):
        choose_threads(1, params=1_000, recorded=2)
    with pytest.raises(ConfigError, match=r"trainer\.threads: the run being resumed computed on 4 threads, this process may use 2 cores"):
        choose_threads("auto", params=1_000, recorded=4)


def spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def main_job_parameters(tiny_cfg, head: str, run_dir, *, busy: bool) -> tuple[int, list[torch.Tensor]]:
    """(threads, weights) after 3 steps of the main job's `head` job at its real size (experiments/quick_ablation.yaml:
    d=96, 6 blocks, 16×128 tokens), alone or beside one busy loop per core."""
    from tests.fit_helpers import fit

    cfg = tiny_cfg("experiment=quick_ablation", f"head={head}", "model.d_model=96", "model.n_heads=4", "data.seq_len=128",
                   "data.batch_size=16", "trainer.max_steps=3")
    loops = [multiprocessing.Process(target=spin, args=(120.0,), daemon=True) for _ in range(threads.usable_cores())] if busy else []
    for loop in loops:
        loop.start()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads.usable_cores())  # what a fresh process starts with
        _, module, _ = fit(cfg, run_dir, max_steps=3, every=100)
        return torch.get_num_threads(), [p.detach().clone() for p in module.model.parameters()]
    finally:
        torch.set_num_threads(before)
        for loop in loops:
            loop.terminate()


@pytest.mark.parametrize("head", ["ntp", "deepseek"])
def test_the_main_job_gives_the_same_digits_idle_and_beside_busy_loops(tiny_cfg, head, tmp_path):
    """Equality, not a tolerance: both runs compute on the same (one) thread, so the same kernels split the same
    reductions the same way; only the load differs. The old policy gave this job 2 threads idle and 1 loaded."""
    idle_threads, idle = main_job_parameters(tiny_cfg, head, tmp_path / "idle", busy=False)
    loaded_threads, loaded = main_job_parameters(tiny_cfg, head, tmp_path / "loaded", busy=True)
    assert idle_threads == loaded_threads == 1
    assert all(torch.equal(a, b) for a, b in zip(idle, loaded))


def test_a_run_records_and_applies_its_choice(tiny_cfg, tmp_path):
    from lab.run.record import RunRecord
    from lab.train import build

    record = RunRecord(tmp_path, [])
    before = torch.get_num_threads()
    try:
        build(tiny_cfg("trainer.threads=2"), record)
        assert torch.get_num_threads() == 2 and record.fields["threads"] == {"setting": "2", "threads": 2, "reason": "set in trainer.threads"}
        build(tiny_cfg(), record)
        assert record.fields["threads"]["setting"] == "auto" and torch.get_num_threads() == record.fields["threads"]["threads"] == 1
    finally:
        torch.set_num_threads(before)


def test_a_resume_of_a_recorded_run_computes_on_the_recorded_count(tiny_cfg, tmp_path, monkeypatch):
    """A small model's new run would take one thread; resumed, the run computes on the two it recorded."""
    import json

    from lab.run.record import RunRecord
    from lab.train import build

    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")  # only its existence marks the resume here
    (tmp_path / "run.json").write_text(json.dumps({"status": "interrupted", "threads": {"setting": "auto", "threads": 2}}))
    record = RunRecord(tmp_path, [])
    before = torch.get_num_threads()
    try:
        build(tiny_cfg("ckpt_path=last", f"hydra.run.dir={tmp_path}", f"paths.output_dir={tmp_path}"), record)
        assert torch.get_num_threads() == 2 and record.fields["threads"]["reason"] == "recorded by the run being resumed"
        with pytest.raises(ConfigError, match="computed on 2 threads, this resume asks for 1"):
            build(tiny_cfg("ckpt_path=last", "trainer.threads=1", f"paths.output_dir={tmp_path}"), RunRecord(tmp_path, []))
    finally:
        torch.set_num_threads(before)

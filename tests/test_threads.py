"""trainer.threads (lab/training/threads.py): the auto policy, the free-core sample, the run's record of it, and the
property that makes a load-dependent thread count safe: 1 and 2 threads train bit for bit alike."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest
import torch

import lab.training.threads as threads
from lab.training.threads import busy_cores_elsewhere, choose_threads


def test_a_number_wins():
    assert choose_threads(3).threads == 3 and choose_threads(3).reason == "set in trainer.threads"


@pytest.mark.parametrize("busy, expected", [(0.0, 2), (0.6, 2), (0.8, 1), (1.7, 1), (2.0, 1)])
def test_auto_takes_the_free_cores_at_least_one(monkeypatch, busy, expected):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "busy_cores_elsewhere", lambda: busy)
    choice = choose_threads("auto")
    assert choice.threads == expected and f"busy on {busy:.1f} cores" in choice.reason


def spin(seconds: float) -> None:
    end = time.time() + seconds
    while time.time() < end:
        pass


def cpu_s_of(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (/proc/<pid>/stat)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def test_the_sample_counts_another_process_spinning():
    """Whatever else the machine runs (the other test worker comes and goes), the sample counts at least the CPU time
    the spinning process itself got while it was taken."""
    spinner = multiprocessing.Process(target=spin, args=(3.0,))
    spinner.start()
    try:
        time.sleep(0.3)
        begin, start = cpu_s_of(spinner.pid), time.perf_counter()
        loaded = busy_cores_elsewhere()
        spinner_cores = (cpu_s_of(spinner.pid) - begin) / (time.perf_counter() - start)
    finally:
        spinner.terminate()
    if spinner_cores < 0.5:
        pytest.skip(f"the spinner got {spinner_cores:.2f} of a core: no idle core to show it on")
    assert loaded >= spinner_cores - 0.15, (loaded, spinner_cores)  # 0.15: the window read around the sample is a little longer


def train_bits(n_threads: int) -> list[torch.Tensor]:
    from lab.model.mtp import build_model
    from lab.objective.objective import Objective
    from lab.objective.weights import Progress
    from lab.training.optim import OptimConfig, build_optimizer
    from lab.training.step import PlainOptimization, train_step
    from tests.helpers import make_batch

    before = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        torch.manual_seed(0)
        model = build_model({"vocab_size": 259, "d_model": 96, "n_layers": 4, "n_heads": 4}, {"name": "deepseek", "depth": 2})
        objective = Objective.build({"policy": "head_mean"}, {"name": "uniform"}, {"name": "sequential"}, k=model.k)
        optimizer, scheduler = build_optimizer(model, OptimConfig(), 10)
        g = torch.Generator().manual_seed(0)
        for step in range(4):
            tokens = torch.randint(0, 259, (8, 64), generator=g)
            train_step(model, objective, make_batch(tokens, torch.zeros_like(tokens)), Progress(step, 0, 10),
                       PlainOptimization(model, optimizer, scheduler, 1.0))
        return [p.detach().clone() for p in model.parameters()]
    finally:
        torch.set_num_threads(before)


def test_one_and_two_threads_train_bit_for_bit_alike():
    for a, b in zip(train_bits(1), train_bits(2)):
        assert torch.equal(a, b)


def test_a_run_records_and_applies_its_choice(tiny_cfg, tmp_path):
    from lab.run.record import RunRecord
    from lab.train import build

    record = RunRecord(tmp_path, [])
    before = torch.get_num_threads()
    try:
        build(tiny_cfg("trainer.threads=2"), record)
        assert torch.get_num_threads() == 2 and record.fields["threads"] == {"setting": "2", "threads": 2, "reason": "set in trainer.threads"}
        build(tiny_cfg(), record)
        assert record.fields["threads"]["setting"] == "auto" and torch.get_num_threads() == record.fields["threads"]["threads"]
    finally:
        torch.set_num_threads(before)

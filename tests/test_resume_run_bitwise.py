"""Exact resume through the real `lab-train` CLI.

Run A trains 8 steps uninterrupted. Run B is the same job, SIGKILLed once its step-4
checkpoint is on disk; run C resumes B's directory with `ckpt_path=last`. The corpus
packs into 3 batches per epoch, so the resume starts mid-epoch and crosses an epoch
boundary; `weights=deepseek` switches λ by consumed tokens after the resume point.
C must log the same training loss, λ and RNG draws as A at every step (bitwise: same CPU
math in the same order) and end with the same weights and optimizer state.
"""

from __future__ import annotations

import csv
import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from tests.cli import SUBPROCESS_TIMEOUT, TINY, kill_session, lab_train, read_run, start_lab_train, wait_for

STEPS, KILL_AT = 8, 4


class StallAfterStep(pl.Callback):
    """Test hook for run B: once the step-`step` checkpoint is in place, say so and wait to be killed."""

    def __init__(self, step: int, marker: str):
        self.step, self.marker = step, Path(marker)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # The step-`step` checkpoint becomes last.ckpt when the next step starts (lab/callbacks/recorded_checkpoint.py).
        if trainer.global_step == self.step + 1:
            self.marker.write_text(str(self.step))
            time.sleep(300)


class RandomProbe(pl.Callback):
    """Draws from the global torch / numpy / python RNGs every step and logs the draws: a resume must continue the streams."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        draws = {"probe/torch": torch.rand(()).item(), "probe/numpy": float(np.random.rand()), "probe/python": random.random()}
        pl_module.log_dict(draws, on_step=True, on_epoch=False, batch_size=1)


class RankProbe(pl.Callback):
    """Rank r draws r + 1 numbers from each global RNG per step (so the ranks' streams differ, as with
    dropout on different shapes); rank 0 logs every rank's first draws, gathered."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        draws = [(torch.rand(()).item(), float(np.random.rand()), random.random()) for _ in range(trainer.global_rank + 1)]
        gathered = pl_module.all_gather(torch.tensor(draws[0], dtype=torch.float64))  # [world, 3]
        for rank, row in enumerate(gathered.reshape(-1, 3).tolist()):
            for source, value in zip(("torch", "numpy", "python"), row):
                pl_module.log(f"probe/rank{rank}/{source}", value, on_step=True, on_epoch=False, batch_size=1, rank_zero_only=True)


def write_corpus(path: Path) -> Path:
    """~40 one-line documents: about 13 packed rows of 32 tokens, i.e. 3 batches of 4 per epoch."""
    path.write_text("".join(f"doc {i:02d} says {'abcdefgh'[i % 8] * (2 + i % 4)}\n" for i in range(40)))
    return path


def job(corpus: Path, run_dir: Path) -> list[str]:
    tiny = [o for o in TINY if not o.startswith("trainer.max_steps")]
    return [
        *tiny, "data=text", f"data.path={corpus}", "data.max_docs=null", f"trainer.max_steps={STEPS}",
        f"callbacks.checkpoint.every_n_train_steps={KILL_AT}", "head=deepseek", "head.depth=1",
        "weights=deepseek", "weights.switch_tokens=700", "logger=csv", "+logger.csv.flush_logs_every_n_steps=1",
        "+callbacks.probe._target_=tests.test_resume_run_bitwise.RandomProbe", f"hydra.run.dir={run_dir}",
    ]


def run_and_kill(job_a: list[str], job_b: list[str], marker: Path, cache_dir: Path, cwd: Path) -> None:
    """Run A to the end; SIGKILL run B (every process of it) once its step-KILL_AT checkpoint is on disk."""
    a = start_lab_train(*job_a, cache_dir=cache_dir, cwd=cwd)
    b = start_lab_train(
        *job_b, "+callbacks.stall._target_=tests.test_resume_run_bitwise.StallAfterStep",
        f"+callbacks.stall.step={KILL_AT}", f"+callbacks.stall.marker={marker}", cache_dir=cache_dir, cwd=cwd,
    )
    try:
        wait_for(marker, b, f"run B reached its step-{KILL_AT} checkpoint")
        assert kill_session(b) == -signal.SIGKILL  # a hard kill of every process of run B, not a clean stop
        assert a.wait(timeout=SUBPROCESS_TIMEOUT) == 0, a.stderr.read()[-3000:]
    finally:
        for process in (a, b):
            kill_session(process)


def train_rows(run_dir: Path) -> dict[int, dict]:
    """Logged step → that step's training row (the last one if a step was logged twice)."""
    rows = csv.DictReader((run_dir / "metrics.csv").open())
    return {int(r["step"]): r for r in rows if r.get("train/loss")}


@pytest.mark.slow  # ~90 s / ~45 s alone; the chaos and signal tests (slow too) kill and resume the same way
def test_killed_run_resumes_bitwise(tmp_path, cache_dir):
    corpus = write_corpus(tmp_path / "corpus.txt")
    run_a, run_b, marker = tmp_path / "a", tmp_path / "b", tmp_path / "stalled"
    run_and_kill(job(corpus, run_a), job(corpus, run_b), marker, cache_dir, tmp_path)
    before = torch.load(run_b / "checkpoints" / "last.ckpt", weights_only=True)
    assert before["global_step"] == KILL_AT and read_run(run_b)["status"] == "running"  # killed: never finished

    resumed = lab_train(*job(corpus, run_b), "ckpt_path=last", cache_dir=cache_dir, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    # The premise: the resume starts mid-epoch and crosses into a later epoch.
    batches_per_epoch = read_run(run_a)["corpus_stats"]["n_rows_train"] // 4
    assert KILL_AT % batches_per_epoch != 0 and STEPS > (KILL_AT // batches_per_epoch + 1) * batches_per_epoch

    rows_a, rows_c = train_rows(run_a), train_rows(run_b)
    assert sorted(rows_a) == sorted(rows_c) == list(range(STEPS))  # rows before the kill are kept
    for step in range(STEPS):
        for name in ("train/loss", "train/loss/h2", "train/lambda/h2", "epoch", "probe/torch", "probe/numpy", "probe/python"):
            assert rows_c[step][name] == rows_a[step][name], (step, name, rows_c[step][name], rows_a[step][name])
    lambdas = [float(rows_a[s]["train/lambda/h2"]) for s in range(STEPS)]
    assert lambdas[KILL_AT] > lambdas[-1], "λ must switch (by consumed tokens) after the resume point"

    record_a, record_c = read_run(run_a), read_run(run_b)
    assert record_c["status"] == "ok"
    assert record_c["manifest"]["weight_position"] == record_a["manifest"]["weight_position"]
    assert record_c["manifest"]["weight_position"]["step"] == STEPS

    final_a = torch.load(run_a / "checkpoints" / "last.ckpt", weights_only=True)
    final_c = torch.load(run_b / "checkpoints" / "last.ckpt", weights_only=True)
    for key, tensor in final_a["state_dict"].items():
        assert torch.equal(tensor, final_c["state_dict"][key]), key
    for index, state in final_a["optimizer_states"][0]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, final_c["optimizer_states"][0]["state"][index][name]), (index, name)
    assert final_a["lr_schedulers"] == final_c["lr_schedulers"]
    assert final_a["mtp_state"]["consumed_tokens"] == final_c["mtp_state"]["consumed_tokens"]
    assert not list((run_b / "checkpoints").glob("*.partial"))  # no temp file left behind


@pytest.mark.slow
def test_killed_ddp_run_resumes_like_an_uninterrupted_one(tmp_path, cache_dir):
    """2-process DDP (gloo): every rank's RNG streams, losses, λ and weights continue exactly after a kill."""
    corpus = write_corpus(tmp_path / "corpus.txt")
    run_a, run_b, marker = tmp_path / "a", tmp_path / "b", tmp_path / "stalled"
    ddp = ["trainer=ddp_cpu", "+callbacks.rank_probe._target_=tests.test_resume_run_bitwise.RankProbe"]
    run_and_kill([*job(corpus, run_a), *ddp], [*job(corpus, run_b), *ddp], marker, cache_dir, tmp_path)
    saved = torch.load(run_b / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == KILL_AT and len(saved["mtp_state"]["rng_by_rank"]) == 2

    resumed = lab_train(*job(corpus, run_b), *ddp, "ckpt_path=last", cache_dir=cache_dir, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows_a, rows_c = train_rows(run_a), train_rows(run_b)
    assert sorted(rows_a) == sorted(rows_c) == list(range(STEPS))
    probes = [f"probe/rank{r}/{s}" for r in (0, 1) for s in ("torch", "numpy", "python")]
    for step in range(STEPS):
        for name in ("train/loss", "train/loss/h2", "train/lambda/h2", *probes):
            assert rows_c[step][name] == rows_a[step][name], (step, name, rows_c[step][name], rows_a[step][name])
    assert rows_a[KILL_AT]["probe/rank0/torch"] != rows_a[KILL_AT]["probe/rank1/torch"]  # the ranks' streams differ
    final_a = torch.load(run_a / "checkpoints" / "last.ckpt", weights_only=True)
    final_c = torch.load(run_b / "checkpoints" / "last.ckpt", weights_only=True)
    for key, tensor in final_a["state_dict"].items():
        assert torch.equal(tensor, final_c["state_dict"][key]), key
    for rank in (0, 1):
        assert torch.equal(final_a["mtp_state"]["rng_by_rank"][rank]["torch"], final_c["mtp_state"]["rng_by_rank"][rank]["torch"])

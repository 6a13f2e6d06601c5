"""Per-step work only where it is logged (issue 21): the meter is sampled, metrics go out on logging steps.

- The saved-tensor meter runs at step 0 and every `every_n_steps` steps of the run (resumed or not)
  (`saved_peak_bytes` is None elsewhere), and a sampled peak equals the peak measured when
  every step is metered (same weights, same batch: the sampling changes nothing it measures).
- Through the real CLI: `train/*` rows only on Lightning's logging steps, `mem/*` rows only on
  the sampled steps, never a stale value repeated at a later step.
"""

from __future__ import annotations

import csv

import pytest
import pytorch_lightning as pl

from lab.callbacks.memory_metrics import LogitLiveness
from lab.train import build
from tests.cli import TINY, lab_train
from tests.fit_helpers import make_trainer


class PeakRecorder(pl.Callback):
    def __init__(self):
        self.peaks = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.peaks.append(outputs["step"].saved_peak_bytes)


def peaks(cfg, run_dir, every: int, max_steps: int, ckpt_path=None) -> list:
    datamodule, module = build(cfg)
    recorder = PeakRecorder()
    trainer = make_trainer(run_dir, max_steps=max_steps, every=3, callbacks=[recorder, LogitLiveness(every_n_steps=every)])
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    return recorder.peaks


@pytest.mark.slow  # 25–45 s alone (tests/README.md)
def test_the_meter_runs_on_sampled_steps_only_and_measures_the_same(tmp_path, tiny_cfg):
    cfg = tiny_cfg("head=parallel", "head.k=2")
    every_step = peaks(cfg, tmp_path / "all", every=1, max_steps=7)
    sampled = peaks(cfg, tmp_path / "sampled", every=3, max_steps=7)
    assert all(isinstance(p, int) and p > 0 for p in every_step)
    assert sampled == [every_step[s] if s % 3 == 0 else None for s in range(7)]
    # A resumed fit follows the run's schedule, not the process's: 3 steps (checkpoint at step 3), then
    # steps 3..6 with every=5 measure step 5 only, exactly as an uninterrupted run would (equal metrics.csv).
    first = peaks(cfg, tmp_path / "first", every=5, max_steps=3)
    resumed = peaks(cfg, tmp_path / "first", every=5, max_steps=7, ckpt_path=str(tmp_path / "first" / "checkpoints" / "last.ckpt"))
    assert first == [every_step[0], None, None]
    assert resumed == [None, None, every_step[5], None]


@pytest.mark.slow  # 25–45 s alone (tests/README.md)
def test_cli_logs_train_metrics_on_logging_steps_and_memory_on_sampled_steps(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    tiny = [o for o in TINY if not o.startswith(("trainer.max_steps", "trainer.log_every_n_steps", "trainer.val_check_interval"))]
    result = lab_train(*tiny, "trainer.max_steps=9", "trainer.log_every_n_steps=3", "trainer.val_check_interval=9",
                       "head=parallel", "head.k=2", "callbacks.liveness.every_n_steps=4", "logger=csv",
                       f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))

    def steps_with(name: str) -> list[int]:
        return [int(r["step"]) for r in rows if r.get(name)]

    assert steps_with("train/loss") == steps_with("train/loss/h2") == steps_with("train/tokens_per_s") == [2, 5, 8]
    assert steps_with("mem/saved_peak_bytes") == steps_with("mem/logits_live_bytes") == [0, 4, 8]

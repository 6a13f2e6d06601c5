"""A non-finite loss stops the run before that step's update (issue 13, item 5).

The trigger is exact and data-independent: DeepSeek λ switches from 0.3 to 1e308 once 300
tokens are consumed, so the first step after the switch has c_2·S_2 = inf in float64 while
every weight is still finite. That step N must raise naming N — the step metrics.csv would
log it under (the rows end at N-1) — leave the weights, optimizer state and `.grad` as they
were, and leave the last checkpoint (global_step N, written after step N-1) as it was.
"""

from __future__ import annotations

import csv
import math
import re

import pytest
import torch

from lab.checkpoint import load_checkpoint
from lab.train import build
from tests.cli import TINY, lab_train, read_run
from tests.fit_helpers import make_trainer

DIVERGING = ["head=deepseek", "head.depth=1", "weights=deepseek", "weights.switch_tokens=300", "weights.final=1e308"]


def failing_step(message: str) -> int:
    found = re.search(r"non-finite loss at step (\d+)", message)
    assert found, message
    return int(found.group(1))


def test_the_update_of_a_non_finite_step_is_never_applied(tmp_path, tiny_cfg):
    datamodule, module = build(tiny_cfg(*DIVERGING))
    trainer = make_trainer(tmp_path, max_steps=6, every=1)
    with pytest.raises(FloatingPointError) as error:
        trainer.fit(module, datamodule=datamodule)
    step = failing_step(str(error.value))
    assert step >= 1 and trainer.global_step == step  # no optimizer step was taken for it
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert saved["global_step"] == step
    # Weights and AdamW state are exactly the checkpoint's: the failing step changed nothing.
    assert all(torch.equal(value, saved["state_dict"][key]) for key, value in module.state_dict().items())
    live = trainer.optimizers[0].state_dict()["state"]
    stored = saved["optimizer_states"][0]["state"]
    assert live.keys() == stored.keys()
    assert all(torch.equal(live[i][name], stored[i][name]) for i in live for name in live[i])
    assert all(p.grad is None for p in module.parameters())  # no Parameter gradient was even written


def test_cli_names_the_logged_step_and_keeps_the_last_good_checkpoint(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    result = lab_train(*TINY, *DIVERGING, "callbacks.checkpoint.every_n_train_steps=1", "logger=csv",
                       f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode != 0
    step = failing_step(result.stderr)
    with (run_dir / "metrics.csv").open() as file:
        logged = [(int(row["step"]), float(row["train/loss"])) for row in csv.DictReader(file) if row["train/loss"]]
    assert [s for s, _ in logged] == list(range(step)) and all(math.isfinite(loss) for _, loss in logged)
    saved = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    assert saved["global_step"] == step  # written after step N-1; the failing step N wrote nothing
    assert all(torch.isfinite(value).all() for value in saved["state_dict"].values())
    record = read_run(run_dir)
    assert record["status"] == "failed" and f"non-finite loss at step {step} " in record["error"]

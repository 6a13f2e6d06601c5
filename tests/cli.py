"""Run the real `lab-train` CLI in a subprocess with a scaled-down config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Every subprocess a test starts gets this long: a correct program on a busy machine (CI shares its
# 2 cores; a run measured at 52 s alone took over 120 s at load 10) must not fail on time. A hang
# is still caught, by pytest-timeout (pyproject.toml), after longer.
SUBPROCESS_TIMEOUT = 1500

TINY = [
    "model.d_model=32",
    "model.n_layers=6",  # compute_match=blocks: K=4 block heads still leave 2 trunk blocks
    "model.n_heads=2",
    "data.max_docs=20",
    "data.seq_len=32",
    "data.batch_size=4",
    "data.max_val_rows=16",
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "trainer.log_every_n_steps=1",
    "optim.warmup_steps=2",
    "trainer.enable_progress_bar=false",
]
# The end-of-run decoding evaluation sized without a time budget: a budgeted plan is sized from measured
# time, so two runs of one config may decode different amounts. Tests comparing two runs pin it.
FIXED_DECODING = ["callbacks.decoding.budget_s=null", "callbacks.decoding.prompts=2", "callbacks.decoding.new_tokens=16",
                  "callbacks.decoding.repeats=1"]


def lab_train(*overrides: str, cache_dir: Path, cwd: Path, timeout: int = SUBPROCESS_TIMEOUT) -> subprocess.CompletedProcess:
    env = {**os.environ, "MTP_LAB_CACHE": str(cache_dir), "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(
        [sys.executable, "-m", "lab.train", *overrides], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def read_run(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


def wandb_history_keys(run_dir: Path) -> tuple[set, list]:
    """Metric names in the offline wandb run, read back with wandb's own `leet inspect`."""
    runs = sorted(Path(run_dir, "wandb").glob("offline-run-*"))
    assert runs, f"no offline wandb run under {run_dir}"
    out = subprocess.run(["wandb", "leet", "inspect", "--json", str(runs[-1])], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    keys, records = set(), [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    for record in records:
        if record.get("type") == "history":
            keys |= set(history_items(record))
    return keys, records


def history_items(record: dict) -> dict:
    return record.get("history", {}).get("item", {})


def wandb_config(run_dir: Path) -> dict:
    """The offline wandb run's config as wandb's own reader (`wandb leet inspect`) gives it, flattened
    with dots the way wandb's UI names the keys (`data.seq_len`)."""
    _, records = wandb_history_keys(run_dir)
    merged: dict = {}
    for record in records:
        if record.get("type") == "config":
            merged.update(record["config"].get("update", {}))
    return flatten(merged)


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out

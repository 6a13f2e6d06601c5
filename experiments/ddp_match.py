"""How closely a `trainer=ddp_cpu` run (2 ranks × B rows) follows one process at 2B rows.

Runs the real `lab-train` twice per learning rate — 2-process DDP (gloo) with
`data.batch_size=B`, one process with `data.batch_size=2B`, same seed — and prints, per
learning rate, the largest relative difference of `train/loss` over the steps and the
validation loss of both at the end.

    python -m experiments.ddp_match [--steps 40] [--lrs 3e-4,3e-3,3e-2]
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TINY = [
    "model.d_model=32", "model.n_layers=3", "model.n_heads=2", "data.max_docs=40", "data.seq_len=32",
    "data.max_val_rows=16", "trainer.log_every_n_steps=1", "optim.warmup_steps=2", "trainer.enable_progress_bar=false",
    "logger=csv",
]


def train(run_dir: Path, *overrides: str) -> dict[int, dict]:
    command = [sys.executable, "-m", "lab.train", *TINY, *overrides, f"hydra.run.dir={run_dir}"]
    out = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "offline"})
    if out.returncode != 0:
        sys.exit(f"error: {' '.join(command)} failed:\n{out.stderr[-2000:]}")
    rows: dict[int, dict] = {}
    for row in csv.DictReader((run_dir / "metrics.csv").open()):
        rows.setdefault(int(row["step"]), {}).update({k: v for k, v in row.items() if v not in ("", None)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=4, help="rows per rank (the single process gets twice as many)")
    parser.add_argument("--lrs", default="3e-4,3e-3,3e-2")
    args = parser.parse_args()
    common = [f"trainer.max_steps={args.steps}", f"trainer.val_check_interval={args.steps}"]
    print(f"{'lr':>8} {'max rel diff train/loss':>24} {'at step':>8} {'step-0 rel diff':>16} {'val/loss ddp':>13} {'val/loss 1p':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        for lr in args.lrs.split(","):
            ddp = train(Path(tmp) / f"ddp-{lr}", *common, f"optim.lr={lr}", "trainer=ddp_cpu", f"data.batch_size={args.batch}")
            one = train(Path(tmp) / f"one-{lr}", *common, f"optim.lr={lr}", f"data.batch_size={2 * args.batch}")
            diffs = {
                step: abs(float(ddp[step]["train/loss"]) - float(one[step]["train/loss"])) / abs(float(one[step]["train/loss"]))
                for step in sorted(one) if "train/loss" in one[step] and "train/loss" in ddp.get(step, {})
            }
            worst = max(diffs, key=diffs.get)
            val = [next(float(r["val/loss"]) for _, r in sorted(rows.items(), reverse=True) if "val/loss" in r) for rows in (ddp, one)]
            print(f"{lr:>8} {diffs[worst]:>24.2e} {worst:>8} {diffs[min(diffs)]:>16.2e} {val[0]:>13.6f} {val[1]:>12.6f}")


if __name__ == "__main__":
    main()

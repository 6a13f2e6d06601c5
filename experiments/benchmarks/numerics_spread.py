"""How far one main-job-sized job's digits move with the machine: the ntp job of `experiment=quick_ablation` (seed 0,
240 steps) under each thread count and each CPU kernel family this machine offers, side by side in one table.

    python -m experiments.benchmarks.numerics_spread [--quick] [--record]

torch's `ATEN_CPU_CAPABILITY` (default / avx2 / avx512) and oneDNN's `ONEDNN_MAX_CPU_ISA` select the kernels another
CPU kind would run, so one machine stands in for several. The spread (max − min of the validation loss) is the noise
floor a one-seed comparison must clear (lab/report/noise.py ONE_SEED_SPREAD). `--record` writes
results/main_job_spread.json; rows measured on other machines (`other_machines` in that file) are kept and count.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "results"
BASE = ["experiment=quick_ablation", "hydra.sweeper.params.head=ntp", "hydra.sweeper.params.seed=0",
        "report.wandb_publish=false", "logger=csv"]
QUICK = ["trainer.max_steps=20", "trainer.val_check_interval=20", "callbacks.checkpoint.every_n_train_steps=20"]
# (kernels shown, environment, threads)
SETTINGS = [("native", {}, 1), ("native", {}, 2), ("ATEN_CPU_CAPABILITY=avx2", {"ATEN_CPU_CAPABILITY": "avx2"}, 1),
            ("ATEN_CPU_CAPABILITY=avx2", {"ATEN_CPU_CAPABILITY": "avx2"}, 2),
            ("ATEN_CPU_CAPABILITY=default", {"ATEN_CPU_CAPABILITY": "default"}, 1),
            ("ONEDNN_MAX_CPU_ISA=AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, 1)]


def run_job(env: dict, threads: int, quick: bool, cwd: Path) -> tuple[str, dict]:
    """(val/loss as runs.csv writes it, the job's numerics fingerprint)."""
    args = [*BASE, f"trainer.threads={threads}", *(QUICK if quick else [])]
    out = subprocess.run([sys.executable, "-m", "lab.train", *args], cwd=cwd, capture_output=True, text=True,
                         env={**os.environ, **env})
    found = re.search(r"report: (\S+)/report\.html", out.stderr + out.stdout)
    if out.returncode != 0 or not found:
        raise SystemExit(f"job failed (rc {out.returncode}): {(out.stderr or out.stdout)[-2000:]}")
    sweep = cwd / found.group(1)
    row = next(csv.DictReader((sweep / "runs.csv").open(newline="")))
    return row["val/loss"], json.loads((sweep / row["run_dir"] / "run.json").read_text()).get("numerics") or {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 steps, two settings (a smoke run)")
    parser.add_argument("--record", action="store_true", help="write results/main_job_spread.json")
    parser.add_argument("--workdir", default="bench_numerics_spread")
    args = parser.parse_args(argv)
    cwd = Path(args.workdir).resolve()
    cwd.mkdir(parents=True, exist_ok=True)
    rows, fingerprint = [], {}
    for kernels, env, threads in SETTINGS[:2] if args.quick else SETTINGS:
        loss, numerics = run_job(env, threads, args.quick, cwd)
        fingerprint = fingerprint or numerics
        rows.append([numerics.get("cpu", "?"), f"{kernels} ({numerics.get('capability')})", str(threads), loss, "measured"])
        print(f"{kernels:<30} {threads} thread(s): val/loss {loss}", flush=True)
    path = RESULTS / "main_job_spread.json"
    others = json.loads(path.read_text()).get("other_machines", []) if path.exists() else []
    losses = [float(row[3]) for row in rows + others]
    spread = max(losses) - min(losses)
    print(f"spread (max − min) over {len(losses)} rows, this machine's and {len(others)} recorded elsewhere: {spread:.4f} nats")
    if args.record and not args.quick:
        write_record(path, rows, others, fingerprint, spread)
        print(f"wrote {path}")


def write_record(path: Path, rows: list, others: list, fingerprint: dict, spread: float) -> None:
    from lab.tracking.numerics import code_version

    commit = code_version(Path(__file__).parent)
    record = {
        "id": "main_job_spread", "title": "One job (ntp, seed 0) of the main job across thread counts and CPU kernels",
        "command": "python -m experiments.benchmarks.numerics_spread --record", "commit": commit,
        "date": datetime.date.today().isoformat(), "machine": fingerprint,
        "provenance": "measured on this machine; rows marked otherwise come from `other_machines`",
        "columns": ["CPU", "kernels (torch capability)", "threads", "val loss (nats)", "source"],
        "rows": rows + others, "other_machines": others, "spread": round(spread, 4),
    }
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

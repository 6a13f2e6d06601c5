"""The README's main job on an idle machine and beside one busy loop per core: wall time, the fair-share ratio,
and whether the validation losses are the same to the last digit.

    python -m experiments.benchmarks.shared_machine_sweep [--quick] [--threads auto|1|2] [--record]

Fair share: with one busy process per core beside it, the sweep is owed half the machine, so its
wall time may grow to 2× its idle time (the fair-share limit, the goal). The busy loops are plain
Python processes spinning for the whole loaded run; they are stopped at the end. Each sweep's
validation losses come from its runs.csv; the two sweeps must agree exactly (trainer.threads=auto
gives these small models one thread, whatever the load, and the sweep runs one job per core side by
side). `--record` writes results/shared_machine_sweep.json.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

FAIR_SHARE = 2.0  # half the machine: one busy loop per core beside the sweep; the goal


def spin(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def sweep(args: list[str], cwd: Path) -> tuple[float, Path]:
    """(wall seconds, sweep dir) of one `lab-train` multirun."""
    begin = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "lab.train", *args], cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - begin
    found = re.search(r"report: (\S+)/report\.html", out.stderr)
    if out.returncode != 0 or not found:
        raise SystemExit(f"sweep failed (rc {out.returncode}):\n{out.stderr[-3000:]}")
    return took, cwd / found.group(1)


def losses(sweep_dir: Path) -> dict[str, str]:
    """job overrides → val/loss as runs.csv writes it (repr: every digit)."""
    with (sweep_dir / "runs.csv").open(newline="") as handle:
        return {row["overrides"]: row["val/loss"] for row in csv.DictReader(handle)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 jobs of 20 steps (a smoke run)")
    parser.add_argument("--threads", default="auto", help="trainer.threads for both sweeps")
    parser.add_argument("--workdir", default="bench_shared_machine", help="where the sweeps write multirun/")
    parser.add_argument("--record", action="store_true", help="write results/shared_machine_sweep.json")
    args = parser.parse_args(argv)
    overrides = ["experiment=quick_ablation", f"trainer.threads={args.threads}"]
    if args.quick:
        overrides += ["hydra.sweeper.params.head=ntp,parallel", "trainer.max_steps=20", "trainer.val_check_interval=20",
                      "callbacks.checkpoint.every_n_train_steps=20", "callbacks.decoding.prompts=1", "callbacks.decoding.new_tokens=8",
                      "hydra.sweeper.params.seed=0"]
    cwd = Path(args.workdir).resolve()
    cwd.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    idle_s, idle_dir = sweep(overrides, cwd)
    print(f"idle: {idle_s:.1f} s ({idle_dir})", flush=True)
    stop_at = time.time() + 24 * 3600
    loops = [multiprocessing.Process(target=spin, args=(stop_at,), daemon=True) for _ in range(cores)]
    for loop in loops:
        loop.start()
    try:
        busy_s, busy_dir = sweep(overrides, cwd)
    finally:
        for loop in loops:
            loop.terminate()
    print(f"beside {cores} busy loops: {busy_s:.1f} s ({busy_dir})")
    ratio = busy_s / idle_s
    print(f"loaded ÷ idle: {ratio:.2f}× (goal ≤ the fair-share limit {FAIR_SHARE:.1f}×: {'PASS' if ratio <= FAIR_SHARE else 'MISS'})")
    same = losses(idle_dir) == losses(busy_dir)
    print(f"validation losses identical to the last digit: {'yes' if same else 'NO'}")
    for job, value in losses(idle_dir).items():
        print(f"  {job}: idle {value}  loaded {losses(busy_dir).get(job)}")
    if args.record and not args.quick:
        write_record(idle_s, busy_s, cores, same, idle_dir)


def minutes(seconds: float) -> str:
    whole_minutes, rest = divmod(round(seconds), 60)
    return f"{whole_minutes} min {rest} s"


def write_record(idle_s: float, busy_s: float, cores: int, same: bool, idle_dir: Path) -> None:
    import datetime
    import json

    run_dir = next(row["run_dir"] for row in csv.DictReader((idle_dir / "runs.csv").open(newline="")))
    root = Path(__file__).resolve().parents[2]
    from lab.tracking.numerics import code_version

    commit = code_version(Path(__file__).parent)
    record = {
        "id": "shared_machine_sweep", "title": "The main job idle and beside one busy loop per core",
        "command": "python -m experiments.benchmarks.shared_machine_sweep --record", "commit": commit,
        "date": datetime.date.today().isoformat(),
        "machine": json.loads((idle_dir / run_dir / "run.json").read_text()).get("numerics") or {},
        "provenance": "measured (one run of each, idle first)",
        "columns": ["machine", "wall time", "÷ idle", "validation losses"],
        "rows": [["idle", minutes(idle_s), "1.00×", "—"],
                 [f"beside {cores} busy loops", minutes(busy_s), f"{busy_s / idle_s:.2f}×",
                  "identical to the last digit" if same else "DIFFERENT"]],
    }
    path = root / "results" / "shared_machine_sweep.json"
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

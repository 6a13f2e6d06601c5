"""Paired decoding speedups of trained runs, as found and beside an artificial load (docs/measuring-speed.md).

For each run directory: its model (checkpoints/last.ckpt) and the prompts its end-of-run evaluation
decoded (decoding.json) are decoded again by the same paired, repeated, interleaved evaluation, first
on the machine as found, then with `--hogs` busy-looping processes beside it (each bounded by
`--hog-seconds`, killed when the phase ends). Printed per run and phase: load, the worker's CPU share,
the contention flag, and the paired median speedup [quartiles] from wall time and from CPU time;
then how far the loaded phase's medians are from the first phase's.

    python -m experiments.benchmarks.contended_decoding multirun/decode_ablation/<date>/*/ --hogs 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from lab.decode.evaluation import evaluate_decoding
from lab.decode.loading import load_for_generation


@contextmanager
def busy_processes(count: int, seconds: float):
    loop = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def measure(run_dir: Path, repeats: int, new_tokens: int | None) -> dict:
    recorded = json.loads((run_dir / "decoding.json").read_text())
    prompts = [entry["prompt"] for entry in recorded["prompts"]]
    settings = recorded["settings"]
    model = load_for_generation(run_dir).model
    report = evaluate_decoding(model, prompts, new_tokens or settings["new_tokens"], settings["temperature"], greedy=False, repeats=repeats)
    return report["metrics"]


def line(name: str, phase: str, m: dict) -> str:
    cells = [f"{m['decode/load_start']:.1f}→{m['decode/load_end']:.1f}", f"{m['decode/cpu_share']:.2f}", "yes" if m["decode/contended"] else "no"]
    for clock in ("", "_cpu"):
        key = f"decode/speedup{clock}"
        cells.append(f"{m[key]:.3f} [{m[key + '_q1']:.3f}–{m[key + '_q3']:.3f}]" if key in m else "—")
    return f"{name:<24} {phase:<14} " + "  ".join(f"{c:<22}" for c in cells)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--hogs", type=int, default=10)
    parser.add_argument("--hog-seconds", type=float, default=300.0, help="each busy process stops by itself after this long")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=None, help="default: the run's own")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'run':<24} {'phase':<14} " + "  ".join(f"{h:<22}" for h in ("load", "CPU share", "contended", "paired wall", "paired CPU")))
    for run_dir in args.runs:
        found = measure(run_dir, args.repeats, args.new_tokens)
        print(line(run_dir.name, "as found", found), flush=True)
        with busy_processes(args.hogs, args.hog_seconds):
            loaded = measure(run_dir, args.repeats, args.new_tokens)
        print(line(run_dir.name, f"+{args.hogs} busy", loaded), flush=True)
        for clock in ("", "_cpu"):
            key = f"decode/speedup{clock}"
            if key in found and key in loaded:
                print(f"{'':<24} {'':<14} {key}: loaded / as found = {loaded[key] / found[key]:.3f}")


if __name__ == "__main__":
    main()

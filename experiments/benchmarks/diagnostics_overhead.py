"""Gradient-diagnostics overhead: amortised step time with `GradDiagnostics` every 1, 10, 50 steps vs off.

Model: the default tiny GPT (d_model 128, 4 layers, 4 heads, byte vocab 259), head
`parallel` K=4 compute-matched (3 trunk blocks + 4 one-block heads), seq 128, batch 16,
reduction head_mean, geometric λ, schedule sequential, AdamW; real batches from the stdlib
DataModule; default parameter groups (last trunk block, embedding, unembedding).

One real Lightning Trainer runs every variant; after a warm-up, two measured phases:

1. paired steps: pairs of consecutive steps, one with a measurement and one without
   (order alternating). The ratio of the two step times, minus 1, is the cost of one
   measurement in training steps, c; neighbours in time share the machine's load, so
   this is robust on a busy machine. The amortised overhead at every_n_steps = n is c/n.
2. blocks (the direct check): per round, one block of steps per variant, in an order
   rotated from round to round: off 50 steps; n=1 10 steps with a measurement in every
   step; n=10 20 steps with measurements in steps 0 and 10; n=50 50 steps with one in
   step 0. A variant's amortised overhead in a round is its mean step time over the same
   round's `off` block, minus 1. Resolving 1-3% this way needs a quiet machine: the
   block IQR is printed so the reader can see whether it does.

Steps are timed as full loop iterations (batch fetch, hooks, training_step including the
measurement, optimizer). The measurement runs inside the training step, between forward
and backward, on the step's own graph (see `lab/callbacks/grad_diagnostics.py`).
Tables: median [interquartile range].

    python -m experiments.benchmarks.diagnostics_overhead            # ~8 min on 2 cores
    python -m experiments.benchmarks.diagnostics_overhead --quick    # seconds-long smoke run
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import Timing, compose, fit_announced, table, verdict  # isort: skip

import argparse
import logging
import statistics
import time
import warnings

import pytorch_lightning as pl
import torch

from lab.callbacks.grad_diagnostics import GradDiagnostics

BLOCKS = {"off": (None, 50), "n=1": (1, 10), "n=10": (10, 20), "n=50": (50, 50)}  # name -> (every_n, steps)
QUICK_BLOCKS = {"off": (None, 10), "n=1": (1, 2), "n=10": (10, 10), "n=50": (50, 10)}  # smoke only: 'n=50' measures every 10


def make_plan(blocks: dict, pairs: int, rounds: int) -> list[tuple[str, int, str, int]]:
    """Per step: (phase, round, variant, index in block); phase 'warmup' | 'pairs' | 'blocks'."""
    plan = []

    def block_round(phase, r):
        names = list(blocks)
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            plan.extend((phase, r, name, i) for i in range(blocks[name][1]))

    block_round("warmup", 0)
    for p in range(pairs):
        for name in (("on", "off") if p % 2 == 0 else ("off", "on")):
            plan.append(("pairs", p, name, 0))
    for r in range(1, rounds + 1):
        block_round("blocks", r)
    return plan


class ScheduledDiagnostics(GradDiagnostics):
    """GradDiagnostics whose due steps follow the plan; times each measurement's computation."""

    def __init__(self, bench: Interleaver):
        super().__init__(every_n_steps=1)
        self.bench = bench
        self.times: list[float] = []

    def is_due(self, trainer) -> bool:
        phase, _, name, i = self.bench.plan[self.bench.step]
        if phase == "pairs":
            return name == "on"
        every = self.bench.blocks[name][0]
        return every is not None and i % every == 0

    def summarise(self, *args, **kwargs):
        start = time.perf_counter()
        snapshot = super().summarise(*args, **kwargs)
        if self.bench.plan[self.bench.step][0] != "warmup":
            self.times.append(time.perf_counter() - start)
        return snapshot


class Interleaver(pl.Callback):
    """Times every loop iteration (end of one on_train_batch_end to the next) by plan entry."""

    def __init__(self, blocks: dict, pairs: int, rounds: int):
        self.blocks = blocks
        self.plan = make_plan(blocks, pairs, rounds)
        self.samples: dict[tuple[str, int, str], list[float]] = {}
        self.mark: float | None = None
        self.step = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.mark is None:
            self.mark = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.perf_counter()
        phase, r, name, _ = self.plan[self.step]
        self.samples.setdefault((phase, r, name), []).append(now - self.mark)
        self.step += 1
        self.mark = time.perf_counter()


def pct(t: Timing, scale: float = 1.0) -> str:
    q1, q3 = t.iqr
    return f"{100 * t.median * scale:+.2f}% [{100 * q1 * scale:+.2f}, {100 * q3 * scale:+.2f}]"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke configuration (seconds)")
    parser.add_argument("--pairs", type=int, default=None, help="measured step pairs (phase 1)")
    parser.add_argument("--rounds", type=int, default=None, help="measured block rounds (phase 2)")
    parser.add_argument("--head", default="parallel")
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args(argv)
    pairs = args.pairs or (4 if args.quick else 60)
    rounds = args.rounds or (1 if args.quick else 3)
    blocks = QUICK_BLOCKS if args.quick else BLOCKS
    d_model, seq_len, batch_size = (32, 32, 4) if args.quick else (128, 128, 16)

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    from lab.train import build

    bench = Interleaver(blocks, pairs, rounds)
    diagnostics = ScheduledDiagnostics(bench)
    # The real default config (conf/train.yaml) with this benchmark's head, λ and sizes.
    datamodule, module = build(compose(
        "seed=0", "data.max_docs=50", f"data.seq_len={seq_len}", f"data.batch_size={batch_size}", f"model.d_model={d_model}", "model.n_layers=4",
        f"head={args.head}", f"head.k={args.k}", "head.compute_match=next_token_path",  # as measured: 4 blocks on the next-token path
        "weights=geometric", f"trainer.max_steps={len(bench.plan)}",
    ))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=len(bench.plan), max_epochs=-1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, deterministic=True, callbacks=[diagnostics, bench],
    )
    start = fit_announced(trainer, module, datamodule, (
        f"diagnostics_overhead: {args.head} K={args.k}, d_model {d_model}, 4 layers (compute_match=next_token_path), vocab 259, "
        f"batch {batch_size} x seq {seq_len}, schedule sequential, default groups, {torch.get_num_threads()} threads; "
        f"{len(bench.plan)} steps: 1 warm-up block round, {pairs} step pairs, {rounds} block rounds"))
    samples = bench.samples

    # phase 1: paired steps
    on = [samples[("pairs", p, "on")][0] for p in range(pairs)]
    off = [samples[("pairs", p, "off")][0] for p in range(pairs)]
    cost = Timing([a / b - 1 for a, b in zip(on, off)])  # one measurement, in steps
    print("\nphase 1 — paired steps (measurement cost c in steps; amortised overhead at n = c/n)")
    print(table(["", "value"], [
        ["step without, ms", Timing(off).ms()],
        ["step with a measurement, ms", Timing(on).ms()],
        ["measurement computation alone, ms", Timing(diagnostics.times).ms()],
        ["c = with/without - 1 (steps)", cost.describe(1, 3)],
        *[[f"amortised overhead, n={n}", pct(cost, 1 / n)] for n in (1, 10, 50)],
    ]))

    # phase 2: blocks
    rows, direct = [], {}
    for name, (every, steps) in blocks.items():
        per_round = [statistics.fmean(samples[("blocks", r, name)]) / statistics.fmean(samples[("blocks", r, "off")]) - 1
                     for r in range(1, rounds + 1)]
        direct[name] = Timing(per_round)
        step_times = Timing([t for r in range(1, rounds + 1) for t in samples[("blocks", r, name)]])
        expected = "" if every is None else pct(cost, 1 / min(every, steps))
        rows.append([name, len(step_times.samples), step_times.ms(), pct(direct[name]), expected])
    print(f"\nphase 2 — blocks ({rounds} rounds; overhead vs the same round's off block)")
    print(table(["variant", "steps", "ms/step", "amortised overhead (direct)", "from phase 1 (c/n)"], rows))

    at50 = cost.median / 50
    note = " (--quick: smoke run, small model, blocks too short for n=50)" if args.quick else ""
    print(f"\namortised overhead at every_n_steps=50: {100 * at50:.2f}% (c/50, phase 1), "
          f"{100 * direct['n=50'].median:+.2f}% direct (phase 2, IQR {pct(direct['n=50']).split(' ', 1)[1]}); "
          f"goal <= 3%: {verdict(at50 <= 0.03)}{note}")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

"""Harness overhead: the Lightning training step against a plain PyTorch loop.

Both sides train the real default config (conf/train.yaml composed by Hydra: tiny model
d_model 128, 4 layers, 4 heads, byte vocab 259, seq 128, batch 16, head ntp, reduction
head_mean, schedule sequential, AdamW with warm-up/cosine LR, grad clip 1.0; 50 stdlib
documents) on the same DataModule, from the same initial weights, with the same step
function `lab.step.train_step`.

- lightning: `MTPLitModule` driven by a real `pytorch_lightning.Trainer` (CPU, no
  logger, no checkpointing, no progress bar, no validation).
- plain: `train_step` with `PlainOptimization` (backward, `clip_grad_norm_`, AdamW +
  LambdaLR) in a plain `for batch in loader` loop, the saved-tensor meter off.
- plain+meter: plain, with the step's `SavedTensorMeter` on, as the module has it.

Interleaving: a Callback times each Lightning step as the wall time between the end
of one `on_train_batch_end` and the next (one full loop iteration: data fetch,
hooks, training_step, optimizer and scheduler step). After every block of N Lightning
steps it runs N plain and N plain+meter steps (their order alternates), each timed
from fetching the batch to the end of the scheduler step. The first rounds are warm-up.

    python -m experiments.benchmarks.harness_overhead            # ~2 min on 2 idle cores
    python -m experiments.benchmarks.harness_overhead --quick    # seconds-long smoke run
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import Timing, compose, paired_ratio, table, verdict  # isort: skip

import argparse
import copy
import logging
import time
import warnings

import pytorch_lightning as pl
import torch

from lab.data import LMDataModule
from lab.module import MTPLitModule
from lab.objective import Progress
from lab.optim import build_optimizer
from lab.step import PlainOptimization, train_step


class PlainLoop:
    """The same step function (`lab.step.train_step`) in a plain `for` loop with torch's backward and optimizer."""

    def __init__(self, template: MTPLitModule, datamodule: LMDataModule, total_steps: int, meter: bool):
        self.model = copy.deepcopy(template.model)  # same initial weights as the Lightning side
        self.objective = template.objective  # stateless: the same reduction, λ and backward schedules
        optimizer, scheduler = build_optimizer(self.model, template.optim, total_steps)
        self.optimization = PlainOptimization(self.model, optimizer, scheduler, template.optim.grad_clip)
        self.datamodule, self.total_steps, self.meter = datamodule, total_steps, meter
        self.loader = iter(datamodule.train_dataloader())
        self.step_index, self.consumed_tokens = 0, 0

    def next_batch(self) -> dict:
        try:
            return next(self.loader)
        except StopIteration:
            self.loader = iter(self.datamodule.train_dataloader())
            return next(self.loader)

    def step(self) -> None:
        batch = self.next_batch()
        progress = Progress(self.step_index, self.consumed_tokens, self.total_steps)
        outputs = train_step(self.model, self.objective, batch, progress, self.optimization, measure_memory=self.meter)
        self.consumed_tokens += outputs.tokens
        self.step_index += 1


class Interleaver(pl.Callback):
    """Times every Lightning step; after each block of Lightning steps, runs and times the plain loops."""

    def __init__(self, plain: dict[str, PlainLoop], block: int, warmup_rounds: int):
        self.plain, self.block, self.warmup_rounds = plain, block, warmup_rounds
        self.samples: dict[str, list[float]] = {"lightning": [], **{name: [] for name in plain}}
        self.steps = 0
        self.mark: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.mark is None:  # the very first step: nothing before it to time from
            self.mark = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        elapsed = time.perf_counter() - self.mark
        round_index = self.steps // self.block
        keep = round_index >= self.warmup_rounds
        if keep:
            self.samples["lightning"].append(elapsed)
        self.steps += 1
        if self.steps % self.block == 0:
            names = list(self.plain)
            if round_index % 2:
                names.reverse()
            for name in names:
                for _ in range(self.block):
                    start = time.perf_counter()
                    self.plain[name].step()
                    if keep:
                        self.samples[name].append(time.perf_counter() - start)
        self.mark = time.perf_counter()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke configuration (seconds)")
    parser.add_argument("--block", type=int, default=None, help="steps per variant per round")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (after warm-up)")
    args = parser.parse_args(argv)
    block = args.block or (1 if args.quick else 10)
    rounds = args.rounds or (1 if args.quick else 20)
    warmup_rounds = 0 if args.quick else 2
    lightning_steps = block * (rounds + warmup_rounds)

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    from lab.train import build

    # The real default config (conf/train.yaml: tiny model, ntp, head_mean, sequential, AdamW), 50 documents.
    datamodule, module = build(compose("seed=0", "data.max_docs=50", f"trainer.max_steps={lightning_steps}"))
    plain = {name: PlainLoop(module, datamodule, lightning_steps, meter=meter)
             for name, meter in (("plain", False), ("plain+meter", True))}
    bench = Interleaver(plain, block, warmup_rounds)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=lightning_steps, max_epochs=-1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, deterministic=True, callbacks=[bench],
    )
    print(
        f"harness_overhead: tiny ntp model (d_model 128, 4 layers, vocab 259), batch 16 x seq 128, schedule sequential, "
        f"{torch.get_num_threads()} threads; {rounds} rounds x {block} steps per variant after {warmup_rounds} warm-up rounds"
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    timings = {name: Timing(values) for name, values in bench.samples.items()}
    plain_t = timings["plain"]
    rows = [[name, len(t.samples), t.ms(), f"{t.median / plain_t.median:.3f}", paired_ratio(t, plain_t).describe()]
            for name, t in timings.items()]
    print(table(["variant", "steps", "ms/step median [IQR]", "vs plain", "paired vs plain [IQR]"], rows))
    print("ratios of medians (the paired column: median of step-by-step ratios within a round):")
    for a, b, what in (("lightning", "plain", "goal <= 1.05"), ("plain+meter", "plain", "cost of SavedTensorMeter"),
                       ("lightning", "plain+meter", "Lightning alone, meter on both sides")):
        value = timings[a].median / timings[b].median
        paired = paired_ratio(timings[a], timings[b]).median
        mark = f"  {verdict(value <= 1.05)}" if what.startswith("goal") else ""
        print(f"  {a + ' / ' + b:24s}: {value:.3f}  (paired {paired:.3f})  {what}{mark}")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

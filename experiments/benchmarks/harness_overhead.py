"""Harness overhead: the full Lightning harness step against a plain PyTorch loop running the same step.

Both sides train the real default config (conf/train.yaml composed by Hydra: tiny model
d_model 128, 4 layers, 4 heads, byte vocab 259, seq 128, batch 16, head ntp, reduction
head_mean, schedule sequential, AdamW with warm-up/cosine LR, grad clip 1.0; 50 stdlib
documents) on the same DataModule, from the same initial weights, with the same step
function `lab.training.step.train_step`.

- harness: `MTPLitModule` in the Trainer that `lab-train` builds: the default callbacks
  (per-horizon metrics, throughput, checkpointing, memory metrics), the default loggers
  (CSV + wandb offline) and the progress bar, all from the composed config. Only validation
  is off (`trainer.limit_val_batches=0`): it is not part of a training step.
  `--bare`: no callbacks, loggers or progress bar (the Lightning loop alone).
- plain: `train_step` with `PlainOptimization` (backward, `clip_grad_norm_`, AdamW +
  LambdaLR) in a plain `for batch in loader` loop, the saved-tensor meter off.
- plain+meter: plain, with the step's `SavedTensorMeter` on at every step.

Interleaving: a Callback times each harness step as the wall time between the end of one
`on_train_batch_end` and the next (one full loop iteration: data fetch, hooks, training_step,
optimizer and scheduler step, logging, callbacks). After every block of N harness steps it
runs N plain and N plain+meter steps (their order alternates), each timed from fetching the
batch to the end of the scheduler step. The first rounds are warm-up. Paired ratio: the
i-th harness step of a round over the i-th plain step of the same round.

`--profile N`: instead of timing, runs N harness steps (after 20 warm-up steps) and N plain
steps under cProfile and prints where the harness spends its time per step (cProfile's own
overhead inflates Python-heavy parts; read it as a breakdown, not as timings).

    python -m experiments.benchmarks.harness_overhead              # ~3 min on 2 idle cores
    python -m experiments.benchmarks.harness_overhead --profile 60
    python -m experiments.benchmarks.harness_overhead --quick      # seconds-long smoke run
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import Timing, compose, fit_announced, paired_ratio, table, verdict  # isort: skip

import argparse
import copy
import cProfile
import logging
import os
import pstats
import tempfile
import time
import warnings

import pytorch_lightning as pl
import torch

from lab.data import LMDataModule
from lab.training.module import MTPLitModule
from lab.objective import Progress
from lab.training.optim import build_optimizer
from lab.training.step import PlainOptimization, train_step


class PlainLoop:
    """The same step function (`lab.training.step.train_step`) in a plain `for` loop with torch's backward and optimizer."""

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
    """Times every harness step; after each block of harness steps, runs and times the plain loops."""

    def __init__(self, plain: dict[str, PlainLoop], block: int, warmup_rounds: int):
        self.plain, self.block, self.warmup_rounds = plain, block, warmup_rounds
        self.samples: dict[str, list[float]] = {"harness": [], **{name: [] for name in plain}}
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
            self.samples["harness"].append(elapsed)
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


class Profiled(pl.Callback):
    """cProfile around harness steps `warmup` .. `warmup + steps - 1` (iteration boundaries at on_train_batch_end)."""

    def __init__(self, profiler: cProfile.Profile, warmup: int, steps: int):
        self.profiler, self.warmup, self.steps, self.seen = profiler, warmup, steps, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen += 1
        if self.seen == self.warmup:
            self.profiler.enable()
        elif self.seen == self.warmup + self.steps:
            self.profiler.disable()


# (label, file suffix, function name): cumulative time of these entry points, per step.
PROFILE_ROWS = [
    ("loop iteration (everything)", "pytorch_lightning/loops/training_epoch_loop.py", "advance"),
    ("  data fetch", "pytorch_lightning/loops/fetchers.py", "__next__"),
    ("  training_step (module)", "lab/training/module.py", "training_step"),
    ("    train_step (lab/training/step.py)", "lab/training/step.py", "train_step"),
    ("      forward", "torch/nn/modules/module.py", "_call_impl"),
    ("      saved-tensor meter pack", "lab/objective/memory.py", "_pack"),
    ("      saved-tensor meter release", "lab/objective/memory.py", "_release"),
    ("      objective.coefficients", "lab/objective/objective.py", "coefficients"),
    ("      backward schedule run", "lab/objective/backward.py", "run"),
    ("      objective.loss", "lab/objective/objective.py", "loss"),
    ("      backward (manual_backward)", "pytorch_lightning/core/module.py", "manual_backward"),
    ("      update (clip, optimizer, LR)", "lab/training/module.py", "update"),
    ("      logit_bytes", "lab/objective/logit_bytes.py", "logit_bytes"),
    ("    self.log / log_dict", "pytorch_lightning/core/module.py", "log"),
    ("  on_train_batch_end hooks (all)", "pytorch_lightning/trainer/call.py", "_call_callback_hooks"),
    ("    HorizonMetrics", "lab/callbacks/horizon_metrics.py", "on_train_batch_end"),
    ("    memory metrics (LogitLiveness)", "lab/callbacks/memory_metrics.py", "on_train_batch_end"),
    ("    TokenThroughput", "lab/callbacks/throughput.py", "on_train_batch_end"),
    ("    progress bar (rich)", "pytorch_lightning/callbacks/progress/rich_progress.py", "on_train_batch_end"),
    ("    progress bar (tqdm)", "pytorch_lightning/callbacks/progress/tqdm_progress.py", "on_train_batch_end"),
    ("    ModelCheckpoint", "pytorch_lightning/callbacks/model_checkpoint.py", "on_train_batch_end"),
    ("  logger connector (metrics to loggers)", "pytorch_lightning/trainer/connectors/logger_connector/logger_connector.py", "update_train_step_metrics"),
    ("    CSVLogger.log_metrics", "pytorch_lightning/loggers/csv_logs.py", "log_metrics"),
    ("    WandbLogger.log_metrics", "pytorch_lightning/loggers/wandb.py", "log_metrics"),
    ("host syncs: Tensor.item", "~", "<method 'item' of 'torch._C.TensorBase' objects>"),
    ("host syncs: Tensor.tolist", "~", "<method 'tolist' of 'torch._C.TensorBase' objects>"),
]


def cumulative(stats: pstats.Stats, suffix: str, name: str) -> tuple[float, int]:
    """(cumulative seconds, calls) of the functions named `name` in files ending with `suffix`."""
    total, calls = 0.0, 0
    for (file, _, function), (_, ncalls, _, cumtime, _) in stats.stats.items():
        if function == name and file.replace("\\", "/").endswith(suffix):
            total, calls = total + cumtime, calls + ncalls
    return total, calls


def profile(module, datamodule, trainer_factory, steps: int) -> None:
    warmup = 20
    harness_profile = cProfile.Profile()
    trainer = trainer_factory([Profiled(harness_profile, warmup, steps)], warmup + steps + 1)
    trainer.fit(module, datamodule=datamodule)
    plain = PlainLoop(module, datamodule, warmup + steps + 1, meter=False)
    for _ in range(warmup):
        plain.step()
    plain_profile = cProfile.Profile()
    plain_profile.enable()
    for _ in range(steps):
        plain.step()
    plain_profile.disable()
    harness_stats, plain_stats = pstats.Stats(harness_profile), pstats.Stats(plain_profile)
    rows = []
    for label, suffix, name in PROFILE_ROWS:
        seconds, calls = cumulative(harness_stats, suffix, name)
        rows.append([label, f"{1e3 * seconds / steps:.2f}", f"{calls / steps:.1f}"])
    plain_step, _ = cumulative(plain_stats, "lab/training/step.py", "train_step")
    rows.append(["plain loop: train_step", f"{1e3 * plain_step / steps:.2f}", "1.0"])
    for label, name in (("plain loop: Tensor.item", "<method 'item' of 'torch._C.TensorBase' objects>"),
                        ("plain loop: Tensor.tolist", "<method 'tolist' of 'torch._C.TensorBase' objects>")):
        seconds, calls = cumulative(plain_stats, "~", name)
        rows.append([label, f"{1e3 * seconds / steps:.2f}", f"{calls / steps:.1f}"])
    print(f"cProfile over {steps} steps (after {warmup} warm-up steps); ms per step, calls per step")
    print(table(["where", "ms/step", "calls/step"], rows))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke configuration (seconds)")
    parser.add_argument("--block", type=int, default=None, help="steps per variant per round")
    parser.add_argument("--rounds", type=int, default=None, help="measured rounds (after warm-up)")
    parser.add_argument("--bare", action="store_true", help="harness without callbacks, loggers and progress bar")
    parser.add_argument("--profile", type=int, default=None, metavar="N", help="profile N steps instead of timing")
    args = parser.parse_args(argv)
    block = args.block or (1 if args.quick else 10)
    rounds = args.rounds or (1 if args.quick else 20)
    warmup_rounds = 0 if args.quick else 2
    harness_steps = block * (rounds + warmup_rounds)

    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    import hydra

    from lab.checkpoint.io import SafeCheckpointIO
    from lab.train import build, instantiate_callbacks

    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    out = tempfile.mkdtemp(prefix="harness-overhead-")
    total_steps = harness_steps if args.profile is None else args.profile + 21
    # The real default config (conf/train.yaml), 50 documents, validation off (not part of a step).
    cfg = compose("seed=0", "model.n_layers=4", "data.max_docs=50", f"trainer.max_steps={total_steps}", "trainer.limit_val_batches=0",
                  "trainer.num_sanity_val_steps=0", f"logger.wandb.save_dir={out}", output_dir=out)  # no Hydra run dir here
    datamodule, module = build(cfg)

    def trainer_factory(extra_callbacks, max_steps):
        if args.bare:
            return pl.Trainer(
                accelerator="cpu", devices=1, max_steps=max_steps, max_epochs=-1, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                deterministic=True, callbacks=list(extra_callbacks),
            )
        # As lab-train builds it (lab/train.py build_and_fit): callbacks, loggers and Trainer from the config.
        callbacks = instantiate_callbacks(cfg)
        loggers = [hydra.utils.instantiate(c) for c in cfg.logger.values()]
        return hydra.utils.instantiate(cfg.trainer, callbacks=[*callbacks, *extra_callbacks], logger=loggers,
                                       plugins=[SafeCheckpointIO()], max_steps=max_steps)

    side = "bare Lightning loop" if args.bare else "harness (default callbacks, CSV + wandb offline, progress bar)"
    if args.profile is not None:
        print(f"harness_overhead --profile: {side}")
        profile(module, datamodule, trainer_factory, args.profile)
        return
    plain = {name: PlainLoop(module, datamodule, harness_steps, meter=meter)
             for name, meter in (("plain", False), ("plain+meter", True))}
    bench = Interleaver(plain, block, warmup_rounds)
    trainer = trainer_factory([bench], harness_steps)
    start = fit_announced(trainer, module, datamodule, (
        f"harness_overhead: {side}; tiny ntp model (d_model 128, 4 layers, vocab 259), batch 16 x seq 128, "
        f"schedule sequential, {torch.get_num_threads()} threads; {rounds} rounds x {block} steps per variant after "
        f"{warmup_rounds} warm-up rounds"))
    timings = {name: Timing(values) for name, values in bench.samples.items()}
    plain_t = timings["plain"]
    rows = [[name, len(t.samples), t.ms(), f"{t.median / plain_t.median:.3f}", paired_ratio(t, plain_t).describe()]
            for name, t in timings.items()]
    print(table(["variant", "steps", "ms/step median [IQR]", "vs plain", "paired vs plain [IQR]"], rows))
    print("ratios of medians (paired: median of step-by-step ratios within a round):")
    for a, b, what in (("harness", "plain", "goal <= 1.03"), ("plain+meter", "plain", "cost of SavedTensorMeter on every step")):
        value = timings[a].median / timings[b].median
        paired = paired_ratio(timings[a], timings[b]).median
        mark = f"  {verdict(paired <= 1.03)}" if what.startswith("goal") else ""
        print(f"  {a + ' / ' + b:24s}: {value:.3f}  (paired {paired:.3f})  {what}{mark}")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

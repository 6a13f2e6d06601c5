"""Step cost and memory of the self-fed DeepSeek rollout (head.rollout=self) by rollout_steps s, against teacher forcing.

One DeepSeek module (D = 1) on the default byte corpus model (V = 259, d_model 128, 4 layers, seq 128,
batch 16): teacher forcing (K = 2), then `rollout=self` with s = 1 … 4 steps (K = s + 1), drafted
tokens, and s = 3 with data tokens. One step = forward + `sequential` schedule + backward + AdamW,
on one torch thread, timed in its CPU time (a shared machine's other load does not count), variants interleaved
round by round; the peak of tensors saved for backward is measured on one step per variant.

    python -m experiments.benchmarks.rollout_cost            # ~2 min on 2 cores
    python -m experiments.benchmarks.rollout_cost --quick    # seconds
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import interleave, paired_ratio, table  # isort: skip

import argparse
import time

import torch

from experiments.benchmarks.mtp_overhead import Variant, byte_batches
from lab.objective.memory import SavedTensorMeter

TEACHER = {"name": "deepseek", "depth": 1, "compute_match": "none"}


def variants() -> dict[str, dict]:
    out = {"teacher (K=2)": TEACHER}
    for steps in (1, 2, 3, 4):
        out[f"self s={steps} drafted (K={steps + 1})"] = {**TEACHER, "rollout": "self", "rollout_steps": steps}
    out["self s=3 data (K=4)"] = {**TEACHER, "rollout": "self", "rollout_steps": 3, "rollout_tokens": "data"}
    return out


def saved_peak(trainer: Variant) -> int:
    meter = SavedTensorMeter(exclude=trainer.model.parameters())
    with meter:
        trainer.step()
    return meter.peak_bytes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # thread CPU time is then all of a step's compute
    repeats, warmup = (args.repeats or (1 if args.quick else 8)), (0 if args.quick else 1)
    batches = byte_batches(4 if args.quick else 16, repeats + warmup + 1)
    model_cfg = {"vocab_size": 259, "d_model": 128, "n_layers": 4, "n_heads": 4}
    trainers = {name: Variant(model_cfg, head, batches) for name, head in variants().items()}
    start = time.perf_counter()
    peaks = {name: saved_peak(trainer) for name, trainer in trainers.items()}
    timings = interleave({name: t.step for name, t in trainers.items()}, repeats=repeats, warmup=warmup, clock=time.thread_time)
    base = "teacher (K=2)"
    rows = [[name, timings[name].ms(), paired_ratio(timings[name], timings[base]).describe(), f"{peaks[name] / 2**20:.1f}",
             f"{peaks[name] / peaks[base]:.2f}"] for name in trainers]
    print(f"rollout_cost: D=1 DeepSeek, d_model 128, 4 layers, V=259, batch {4 if args.quick else 16}x128, "
          f"{torch.get_num_threads()} threads, {repeats} interleaved repeats (thread CPU time)")
    print(table(["variant", "CPU ms/step median [IQR]", "vs teacher (paired) [IQR]", "saved MiB", "vs teacher"], rows))
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

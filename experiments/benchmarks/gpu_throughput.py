"""GPU throughput of MTP at GPT-2-small scale: tokens/s, MFU and the MTP/ntp step ratio.

Model: GPT-2-small class (12 layers, d 768, 12 attention heads, ≈124M parameters with the
BPE tokenizer's V = 50,304), sequences of 1,024 tokens, batch 8, the stdlib corpus packed
by LMDataModule. Variants: ntp, parallel K=4 and DeepSeek D=1 (compute-matched as
configured by default), each eager and compiled (`lab.model.compile.compile_units`, what
`model.compile=true` does). One step = bf16 autocast forward + backward schedule
(`sequential`, head_mean, uniform λ) + backward + clipped AdamW — `lab.training.step.train_step`, the
training step itself, under bf16 autocast as Lightning's bf16-mixed precision plugin runs it
(float32 parameters and optimizer state); the saved-tensor meter is off. Variants are timed
interleaved in rotated order after warm-up (which also triggers compilation), each step
ending in a device synchronisation. MFU = counted training FLOPs per token
(lab/nn/flops.py) × tokens/s ÷ the device's bf16 peak (lab/callbacks/peak_flops.py).

    python -m experiments.benchmarks.gpu_throughput                  # one GPU, < 5 min
    python -m experiments.benchmarks.gpu_throughput --peak H100       # a peak by name or FLOP/s
    python -m experiments.benchmarks.gpu_throughput --quick           # tiny CPU/GPU smoke run (seconds)
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import interleave, paired_ratio, table, verdict  # isort: skip

import argparse
import itertools
import time

import torch

from lab.callbacks.peak_flops import device_peak_name, resolve_peak_flops
from lab.data import LMDataModule
from lab.model.compile import compile_units
from lab.nn.flops import training_flops_per_token
from lab.model.mtp import build_model, parameter_table
from lab.objective import Progress
from lab.objective.objective import Objective
from lab.training.optim import OptimConfig, build_optimizer
from lab.training.step import PlainOptimization, train_step

HEADS = {"ntp": {"name": "ntp"}, "parallel K=4": {"name": "parallel", "k": 4}, "deepseek D=1": {"name": "deepseek", "depth": 1}}
FULL = dict(d_model=768, n_layers=12, n_heads=12, vocab_size=50304, seq_len=1024, batch_size=8, tokenizer="bpe")
QUICK = dict(d_model=64, n_layers=5, n_heads=2, vocab_size=512, seq_len=64, batch_size=2, tokenizer="bpe")


class Variant:
    """One model stepping through `lab.training.step.train_step` (the training step itself) with torch's backward and AdamW."""

    def __init__(self, model_cfg: dict, head: dict, batches: list[dict], device: torch.device, compiled: bool):
        torch.manual_seed(0)
        self.model = build_model(model_cfg, head).to(device)
        if compiled:
            compile_units(self.model)
        self.objective = Objective.build({"policy": "head_mean"}, {"name": "uniform"}, {"name": "sequential"}, k=self.model.k)
        optim = OptimConfig(lr=3e-4, warmup_steps=10)
        optimizer, scheduler = build_optimizer(self.model, optim, total_steps=1000)
        self.optimization = PlainOptimization(self.model, optimizer, scheduler, optim.grad_clip)
        self.device = device
        self.batches = itertools.cycle(batches)
        self.steps = 0

    def step(self) -> None:
        # Lightning's bf16-mixed runs the whole manual-optimisation training_step under autocast.
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            train_step(self.model, self.objective, next(self.batches), Progress(self.steps, 0, 1000), self.optimization,
                       measure_memory=False)
        self.steps += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def corpus_batches(shape: dict, n: int, device: torch.device) -> list[dict]:
    datamodule = LMDataModule(source="stdlib", max_docs=None if shape is FULL else 60, tokenizer=shape["tokenizer"],
                              vocab_size=shape["vocab_size"], seq_len=shape["seq_len"], batch_size=shape["batch_size"], seed=0)
    datamodule.setup("fit")
    batches = list(itertools.islice(iter(datamodule.train_dataloader()), n))
    assert len(batches) == n, f"corpus gives {len(batches)} batches, need {n}"
    return [{key: value.to(device, non_blocking=True) for key, value in batch.items()} for batch in batches]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke configuration (seconds, CPU or GPU)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--peak", default="auto", help="bf16 peak FLOP/s per device: auto, a name (H200, H100, H100-PCIe, A100) or a number")
    parser.add_argument("--no-compile", action="store_true", help="eager variants only")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    shape = QUICK if args.quick else FULL
    repeats = args.repeats or (2 if args.quick else 20)
    warmup = 1 if args.quick else 3  # compiled variants compile in the first warm-up round
    peak = None if args.peak == "none" else resolve_peak_flops(float(args.peak) if args.peak[0].isdigit() else args.peak, device)
    start = time.perf_counter()
    batches = corpus_batches(shape, 4, device)
    tokens_per_step = shape["batch_size"] * shape["seq_len"]
    model_cfg = {key: shape[key] for key in ("vocab_size", "d_model", "n_layers", "n_heads")}
    modes = ("eager",) if args.no_compile else ("eager", "compiled")
    variants = {f"{name} {mode}": Variant(model_cfg, head, batches, device, mode == "compiled") for name in HEADS for mode in modes for head in [HEADS[name]]}
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"gpu_throughput: {device_name} (peak {device_peak_name(device) or args.peak}: "
        f"{'unknown' if peak is None else f'{peak / 1e12:.1f} TFLOP/s'} bf16), d_model {shape['d_model']}, "
        f"{shape['n_layers']} layers, V={shape['vocab_size']}, batch {shape['batch_size']}x{shape['seq_len']}, bf16 autocast, "
        f"schedule sequential, AdamW; {repeats} interleaved rounds after {warmup} warm-up; "
        f"data ready in {time.perf_counter() - start:.0f} s"
    )
    timings = interleave({name: v.step for name, v in variants.items()}, repeats=repeats, warmup=warmup)
    rows, tokens_per_s, flop_rate = [], {}, {}
    for name, variant in variants.items():
        base = "ntp " + name.split()[-1]
        flops = training_flops_per_token(variant.model, shape["seq_len"])
        tokens_per_s[name] = tokens_per_step / timings[name].median
        flop_rate[name] = flops * tokens_per_s[name]
        mfu = "n/a" if peak is None else f"{flops * tokens_per_s[name] / peak:.3f}"
        params = parameter_table(variant.model)["params_total"]
        ratio = timings[name].median / timings[base].median
        paired = paired_ratio(timings[name], timings[base]).describe()
        rows.append([name, f"{params / 1e6:.1f}M", f"{flops / 1e9:.3f}", timings[name].ms(), f"{tokens_per_s[name]:,.0f}", mfu,
                     f"{ratio:.3f}", paired])
    headers = ["variant", "params", "GFLOP/token", "ms/step median [IQR]", "tokens/s", "MFU", "step vs ntp", "paired vs ntp [IQR]"]
    print(table(headers, rows))
    print("step vs ntp: ratio of medians against ntp in the same mode; paired: median [IQR] of per-round ratios")
    if not args.no_compile:
        for name in HEADS:
            speedup = timings[f"{name} eager"].median / timings[f"{name} compiled"].median
            print(f"compiled speed-up {name}: eager / compiled = {speedup:.3f}")
    # MTP costs more FLOPs per token by design; what it must not do is use the device worse.
    # FLOP throughput ratio = (FLOPs/token × tokens/s) of the variant over ntp's = MFU ratio, peak-free.
    for mode in modes:
        ratio = flop_rate[f"parallel K=4 {mode}"] / flop_rate[f"ntp {mode}"]
        print(f"goal: parallel K=4 FLOP throughput >= 0.9 x ntp ({mode}) : {ratio:.3f}  {verdict(ratio >= 0.9)}")
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

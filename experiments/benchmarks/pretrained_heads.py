"""Training tokens/s of MTP heads on a pretrained trunk: head-only (frozen) vs LoRA vs joint.

Medusa K=5 (one residual block per head) on a transformers Llama; one step = forward +
`sequential` schedule run + backward + AdamW step over the trainable Parameters (frozen: the
heads; lora: adapters r=8 on q/v + heads; joint: everything; frozen Parameters get no gradient, so AdamW skips them). The variants are interleaved on
the same batches each round (experiments/benchmarks/common.py); tokens/s = B·S / step time.

    python -m experiments.benchmarks.pretrained_heads              # tiny Llama config (CPU, ~1 min)
    python -m experiments.benchmarks.pretrained_heads --model PATH # a local HF model folder
    python -m experiments.benchmarks.pretrained_heads --quick      # seconds-long smoke run
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import interleave, paired_ratio, table  # isort: skip

import argparse
import time

import torch

from experiments.benchmarks.mtp_overhead import Variant, random_batches
from lab.model.mtp import build_model

TINY_LLAMA = {"model_type": "llama", "vocab_size": 4096, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6,
              "num_attention_heads": 8, "num_key_value_heads": 4}
MODES = ("frozen", "lora", "joint")


def variant(model: dict, mode: str, batches: list[dict]) -> Variant:
    return Variant(model, {"name": "medusa", "k": 5, "trunk_grad": mode, "lora": {"r": 8}}, batches)


def trainable(variant: Variant) -> int:
    return sum(p.numel() for p in variant.model.parameters() if p.requires_grad)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="a local Hugging Face model folder (default: a tiny Llama config)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 8)
    warmup = 0 if args.quick else 1
    model = {"name": "hf", "path": args.model} if args.model else {"name": "hf", "config": TINY_LLAMA if not args.quick else {**TINY_LLAMA, "num_hidden_layers": 2}}
    start = time.perf_counter()
    probe = build_model(model, {"name": "ntp"})
    vocab = probe.trunk.cfg.vocab_size
    del probe
    batches = random_batches(vocab, args.batch, args.seq, repeats + warmup)
    variants = {mode: variant(model, mode, batches) for mode in MODES}
    timings = interleave({mode: v.step for mode, v in variants.items()}, repeats=repeats, warmup=warmup)
    tokens = args.batch * args.seq
    print(f"pretrained_heads: medusa K=5 on {args.model or 'a tiny Llama config (d 256, 6 layers, V 4096)'}; B x S = {args.batch}x{args.seq}; "
          f"{torch.get_num_threads()} threads; {repeats} interleaved repeats after {warmup} warm-up")
    rows = []
    for mode, runner in variants.items():
        median = timings[mode].median
        rows.append([mode, trainable(runner), timings[mode].ms(), f"{tokens / median:,.0f}", f"{timings['joint'].median / median:.2f}",
                     paired_ratio(timings["joint"], timings[mode]).describe()])
    print(table(["mode", "trainable params", "ms/step median [IQR]", "tokens/s", "speed vs joint", "paired vs joint [IQR]"], rows))
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

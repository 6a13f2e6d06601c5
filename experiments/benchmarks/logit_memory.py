"""Logit memory and step time of the backward schedules (joint, sequential, chunked).

For each vocabulary size V and horizon count K, a `parallel` head (not compute-matched)
on a small trunk runs one training step (forward + schedule.run + backward, no
optimizer) per schedule:

- peak saved bytes: `SavedTensorMeter(exclude=model.parameters())` around the step, as the
  module meters it (what `mem/saved_peak_bytes` logs); Parameter storages are not counted;
- base: the meter's live bytes right after the model forward (trunk + head
  activations, before any logits exist); (peak − base) / logit_bytes says how closely
  the measured peak follows the logical `logit_bytes` (`mem/logits_live_bytes`);
- rss Δ: process peak RSS during the step minus RSS before it (after `malloc_trim`),
  an approximate cross-check that also sees transient tensors the meter cannot
  (the chunked op never saves its chunk logits for backward);
- time: median [IQR] over interleaved repeats across schedules (without the meter);
  time/joint is the ratio of medians, paired the median of per-round ratios. chunked
  computes no top-1 accuracy (its logits never exist), joint and sequential do.

`--pretrained`: the pretrained-vocabulary rows — the same step on a `model=hf` trunk (a tiny
transformers Llama built from its config, tied embeddings, head blocks `native`) with the
vocabularies of SmolLM2 (49,152) and Qwen2 (151,936), where a pretrained trunk's vocabulary
makes `schedule=sequential|chunked` matter.

    python -m experiments.benchmarks.logit_memory            # full grid, 2-5 min on 2 cores
    python -m experiments.benchmarks.logit_memory --quick    # seconds-long smoke run
    python -m experiments.benchmarks.logit_memory --pretrained [--quick]
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import Timing, interleave, paired_ratio, table, verdict  # isort: skip

import argparse
import ctypes
import re
import time

import torch

from lab.model.mtp import build_model
from lab.objective import build_backward_schedule, coefficients, logit_bytes
from lab.objective.memory import SavedTensorMeter

SCHEDULES = ("joint", "sequential", "chunked")
MB = 1e6

try:
    _LIBC = ctypes.CDLL("libc.so.6")
except OSError:  # not glibc: RSS figures are then less reliable, still reported
    _LIBC = None


def random_batch(vocab: int, batch: int, seq: int, generator: torch.Generator) -> dict:
    """One document per row, every token active."""
    return {
        "tokens": torch.randint(0, vocab, (batch, seq), generator=generator),
        "active": torch.ones(batch, seq, dtype=torch.bool),
        "segment_ids": torch.zeros(batch, seq, dtype=torch.long),
        "position_ids": torch.arange(seq).expand(batch, seq).contiguous(),
    }


def train_step(model, schedule, batch: dict, meter: SavedTensorMeter | None = None):
    """forward + schedule.run + backward; returns (per-horizon counts, saved bytes after the forward)."""
    model.zero_grad(set_to_none=True)
    horizons = model(batch)
    base = meter.live_bytes if meter is not None else 0  # saved bytes after the forward
    counts = torch.stack([h.mask.sum() for h in horizons]).to(torch.float64)  # [K]
    coeffs = coefficients("head_mean", counts, torch.ones(len(horizons)), fixed_denominator=batch["tokens"].numel())
    root, stats = schedule.run(horizons, coeffs.to(torch.float32))
    root.backward()
    return stats.counts.tolist(), base


def _rss() -> tuple[int, int]:
    """(peak RSS since the last reset, current RSS) in bytes, from /proc (Linux)."""
    with open("/proc/self/status") as handle:
        status = handle.read()

    def field(name: str) -> int:
        return int(re.search(rf"{name}:\s+(\d+)", status).group(1)) * 1024

    return field("VmHWM"), field("VmRSS")


def _reset_rss_peak() -> int:
    if _LIBC is not None:
        _LIBC.malloc_trim(0)  # give freed heap back so the next peak is the step's own
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")  # reset VmHWM to the current RSS
    except OSError:
        pass
    return _rss()[1]


def measure_memory(model, schedule, batch) -> dict:
    rss_before = _reset_rss_peak()
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        counts, base = train_step(model, schedule, batch, meter)
    return {"peak": meter.peak_bytes, "base": base, "counts": counts, "rss": _rss()[0] - rss_before}


def build(vocab: int, k: int, args):
    """The harness's GPT, or (`--pretrained`) a tiny transformers Llama of the same width and depth."""
    if args.pretrained:
        config = {"model_type": "llama", "vocab_size": vocab, "hidden_size": args.d_model, "intermediate_size": 2 * args.d_model,
                  "num_hidden_layers": args.n_layers, "num_attention_heads": args.n_heads, "num_key_value_heads": args.n_heads // 2,
                  "tie_word_embeddings": True}
        return build_model({"name": "hf", "config": config}, {"name": "parallel", "k": k, "block": "native"})
    model_cfg = {"vocab_size": vocab, "d_model": args.d_model, "n_layers": args.n_layers, "n_heads": args.n_heads}
    return build_model(model_cfg, {"name": "parallel", "k": k, "compute_match": "none"})


def run_config(vocab: int, k: int, args) -> list[dict]:
    torch.manual_seed(0)
    model = build(vocab, k, args)
    batch = random_batch(vocab, args.batch, args.seq, torch.Generator().manual_seed(vocab + k))
    schedules = {name: build_backward_schedule(name, args.chunk_rows) for name in SCHEDULES}
    timings: dict[str, Timing] = interleave(
        {name: (lambda s=schedule: train_step(model, s, batch)) for name, schedule in schedules.items()},
        repeats=args.repeats,
        warmup=1,
    )
    # One metered step per schedule, after the timing (warm allocator, so RSS shows the step itself).
    memory = {name: measure_memory(model, schedule, batch) for name, schedule in schedules.items()}
    results = []
    for name in SCHEDULES:
        mem = memory[name]
        logical = logit_bytes(mem["counts"], vocab, schedule=name, chunk_rows=args.chunk_rows)
        results.append({"V": vocab, "K": k, "schedule": name, **mem, "logical": logical, "time": timings[name]})
    return results


def report(results: list[dict]) -> str:
    by_key = {(r["V"], r["K"], r["schedule"]): r for r in results}
    rows = []
    for r in results:
        joint = by_key[(r["V"], r["K"], "joint")]
        k1 = by_key.get((r["V"], 1, r["schedule"]))
        rows.append([
            r["V"], r["K"], r["schedule"],
            f"{r['peak'] / MB:.1f}",
            f"{r['peak'] / joint['peak']:.3f}",
            f"{r['peak'] / k1['peak']:.2f}" if k1 else "-",
            f"{r['base'] / MB:.1f}",
            f"{r['logical'] / MB:.1f}",
            f"{(r['peak'] - r['base']) / r['logical']:.3f}",
            f"{r['rss'] / MB:.0f}",
            r["time"].ms(),
            f"{r['time'].median / joint['time'].median:.3f}",
            f"{paired_ratio(r['time'], joint['time']).median:.3f}",
        ])
    headers = ["V", "K", "schedule", "peak MB", "peak/joint", "peak/K=1", "base MB", "logit MB",
               "(peak-base)/logit", "rss Δ MB", "time ms [IQR]", "time/joint", "paired"]
    return table(headers, rows)


def goals(results: list[dict], vocab: int, k: int) -> list[str]:
    by = {r["schedule"]: r for r in results if r["V"] == vocab and r["K"] == k}
    if set(by) != set(SCHEDULES):
        return [f"goals at V={vocab}, K={k}: not measured in this configuration"]
    joint, seq, chunk = by["joint"], by["sequential"], by["chunked"]
    seq_mem = seq["peak"] / joint["peak"]
    chunk_mem = chunk["peak"] / joint["peak"]
    seq_time = seq["time"].median / joint["time"].median
    seq_paired = paired_ratio(seq["time"], joint["time"]).median
    lines = [
        f"goals at V={vocab}, K={k}:",
        f"  sequential peak <= 0.35 x joint : {seq_mem:.3f}  {verdict(seq_mem <= 0.35)}",
        f"  chunked peak    <= 0.15 x joint : {chunk_mem:.3f}  {verdict(chunk_mem <= 0.15)}",
        f"  sequential time <= 1.05 x joint : {seq_time:.3f}  {verdict(seq_time <= 1.05)}  (paired {seq_paired:.3f})",
    ]
    for name, r in by.items():
        follow = (r["peak"] - r["base"]) / r["logical"]
        note = "  (the meter sees saved tensors only; chunk logits are never saved)" if name == "chunked" else ""
        ok = verdict(abs(follow - 1) <= 0.15)
        lines.append(f"  (peak-base)/logit_bytes within 15% [{name}] : {follow:.3f}  {ok}{note}")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke configuration (seconds)")
    parser.add_argument("--pretrained", action="store_true", help="model=hf rows at pretrained vocabularies (49,152 and 151,936)")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    if args.pretrained:
        quick = args.quick
        args.vocabs, args.ks, args.batch, args.seq = ((49152,), (1, 2), 2, 64) if quick else ((49152, 151936), (1, 4), 2, 64)
        args.repeats = args.repeats or (1 if quick else 2)
        args.goal_v, args.goal_k = (49152, 2) if quick else (151936, 4)
    elif args.quick:
        args.vocabs, args.ks, args.batch, args.seq, args.repeats = (4096,), (1, 2), 2, 64, args.repeats or 1
        args.goal_v, args.goal_k = 4096, 2
    else:
        args.vocabs, args.ks, args.batch, args.seq, args.repeats = (256, 8192, 32768), (1, 2, 4, 8), 4, 128, args.repeats or 5
        args.goal_v, args.goal_k = 32768, 4
    args.d_model, args.n_layers, args.n_heads, args.chunk_rows = 64, 2, 4, 256

    trunk = "model=hf tiny Llama (tied, native head blocks)" if args.pretrained else "the harness's GPT"
    print(
        f"logit_memory: {trunk}, parallel head (compute_match=none), d_model {args.d_model}, trunk {args.n_layers} layers, "
        f"{args.n_heads} attention heads, batch {args.batch} x seq {args.seq}, chunk_rows {args.chunk_rows}, "
        f"float32, {torch.get_num_threads()} threads, {args.repeats} interleaved repeats per schedule"
    )
    start = time.perf_counter()
    results = []
    for vocab in args.vocabs:
        for k in args.ks:
            results.extend(run_config(vocab, k, args))
    print(report(results))
    print("\n".join(goals(results, args.goal_v, args.goal_k)))
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

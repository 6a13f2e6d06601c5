"""Throughput of batched requests, plain vs speculative, by batch size (`decode_speed --batch 1,4,16`).

For each model and batch size B: B prompts decoded together (lab.decode.batched, and
lab.decode.batched_speculative with the model's own heads), plain and speculative calls
alternating, `repeats` timed calls each, every call with the same per-prompt generators (the
same draws every repeat). Throughput = all rows' new tokens / wall time of the call; latency =
wall time of the call (every request of the batch finishes with it). The seed's point: at
batch 1 speculation turns spare compute into fewer sequential steps; at large batch the verify
pass over 1 + m slots per row is no longer nearly free, so speculation can lower throughput
while it still lowers the number of sequential steps.
"""

from __future__ import annotations

from experiments.benchmarks.common import Timing, cpu_clock, interleave, paired_ratio, table  # isort: skip

import statistics

import torch

from lab.decode import generate
from lab.decode.evaluation import DEGENERATE_BELOW, distinct_ngram_ratio


def batch_prompts(prompts: list[list[int]], batch: int) -> list[torch.Tensor]:
    """`batch` prompts, cycling through the given ones."""
    return [torch.tensor(prompts[i % len(prompts)]) for i in range(batch)]


def one_batch(model, prompts: list[torch.Tensor], new_tokens: int, temperature: float, speculative: bool, eos: int | None):
    generators = [torch.Generator().manual_seed(1000 + i) for i in range(len(prompts))]
    return generate(model, prompts, new_tokens, temperature=temperature, speculative=speculative, eos=eos, generator=generators)


def batch_row(model, prompts: list[torch.Tensor], new_tokens: int, temperature: float, eos: int | None, repeats: int) -> list:
    """One table row: B, tokens/s plain and speculative, paired ratio, latency, tokens per forward, acceptance, degeneracy."""
    outputs = {}

    def run(speculative: bool):
        outputs[speculative] = one_batch(model, prompts, new_tokens, temperature, speculative, eos)

    timings = interleave({"plain": lambda: run(False), "speculative": lambda: run(True)}, repeats=repeats, clock=cpu_clock())
    emitted = {mode: sum(len(g.tokens) for g in outputs[mode == "speculative"]) for mode in timings}
    rate = {mode: Timing([emitted[mode] / s for s in t.samples]) for mode, t in timings.items()}
    spec = outputs[True]
    per_forward = statistics.fmean(g.stats["tokens_per_forward"] for g in spec)
    accept_len = statistics.fmean(g.stats["mean_accept_len"] for g in spec)
    degenerate = sum(distinct_ngram_ratio(g.tokens) < DEGENERATE_BELOW for g in spec)
    return [len(prompts), rate["plain"].describe(1, 1), rate["speculative"].describe(1, 1),
            paired_ratio(timings["plain"], timings["speculative"]).describe(1, 2),
            f"{timings['plain'].median * 1e3:.0f} / {timings['speculative'].median * 1e3:.0f}", f"{per_forward:.2f}", f"{accept_len:.2f}",
            f"{degenerate}/{len(prompts)}"]


def batch_report(models: list[tuple[str, object, list[list[int]], int | None]], batches: list[int], new_tokens: int, repeats: int) -> None:
    """models: (name, model, prompts, eos). One table per model and temperature (T=1 first: the headline)."""
    print(f"\n== batched requests: plain vs speculative throughput by batch size, {torch.get_num_threads()} threads, "
          f"{new_tokens} new tokens per request, {repeats} interleaved calls per mode")
    headers = ["B", "plain tokens/s median [IQR]", "speculative tokens/s", "spec/plain throughput (paired)", "latency ms plain / spec",
               "spec tokens/forward", "mean accept len", "degenerate rows"]
    for name, model, prompts, eos in models:
        for temperature, label in ((1.0, "sampling T=1.0 (headline)"), (0.0, "greedy")):
            rows = [batch_row(model, batch_prompts(prompts, b), new_tokens, temperature, eos, repeats) for b in batches]
            print(f"-- {name}: {label}")
            print(table(headers, rows))

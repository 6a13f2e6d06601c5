"""`lab-generate --speculative`: the speculative run against plain decoding of the same prompt, as `decode_speed` measures it.

Each pair decodes the prompt plainly and speculatively back to back, in alternating order
(lab/decode/paired.py); the speed ratio is the median over pairs with its quartiles, from the worker
thread's CPU time when any run was contended (another process held the cores), else from wall time.
Greedy speculative decoding emits the target's own argmax, so in float32 its tokens equal plain
decoding's; in bfloat16 a verification pass over several rows rounds differently from a one-row pass,
and where the top two logits lie within that rounding the two continuations part. The line says
whether the tokens matched, and why they may not have.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lab.decode.generate import generate
from lab.decode.paired import median_quartiles, pair_order, speed_ratio
from lab.tracking.timing import Span, timed

BF16_NOTE = ("bf16: a near-tie of the top two logits can part speculative from plain greedy tokens "
             "(a multi-row verification pass rounds differently; docs/real-model.md)")


@dataclass
class Comparison:
    ratios: list[float]  # speculative ÷ plain tokens per second, one per pair, on `clock`
    clock: str  # "cpu" (contended) or "wall"
    plain_tokens: list[int]
    same_tokens: bool
    low_precision: bool
    spans: list[Span]

    def line(self) -> str:
        median, q1, q3 = median_quartiles(self.ratios)
        clock = "worker CPU time (contended)" if self.clock == "cpu" else "wall time"
        text = f"speed vs plain: {median:.2f}× [{q1:.2f}–{q3:.2f}] (median [quartiles] of {len(self.ratios)} paired runs, {clock})"
        text += f"  same tokens as plain: {'yes' if self.same_tokens else 'no'}"
        return text + (f"  ({BF16_NOTE})" if self.low_precision else "")


def compare_with_plain(model, prompt: torch.Tensor, new_tokens: int, options: dict, seed: int, pairs: int) -> tuple[object, Comparison]:
    """(the first speculative Generation, the comparison over `pairs` paired runs)."""
    runs: list[tuple[int, Span, int, Span]] = []
    first, plain_tokens, spans = None, None, []
    for repeat in range(pairs):
        measured = {}
        for speculative in pair_order(0, repeat):
            generator = torch.Generator().manual_seed(seed)
            out, span = timed(lambda: generate(model, prompt, new_tokens, speculative=speculative, generator=generator,
                                               **(options if speculative else plain_options(options))))
            measured[speculative] = (out, span)
            spans.append(span)
        (spec, spec_span), (plain, plain_span) = measured[True], measured[False]
        first, plain_tokens = first or spec, plain_tokens or plain.tokens
        runs.append((len(spec.tokens), spec_span, len(plain.tokens), plain_span))
    clock = "cpu" if any(span.contended for span in spans) else "wall"
    ratios = [speed_ratio(*run, clock) for run in runs]
    dtype = next(model.parameters()).dtype
    same = first.tokens == plain_tokens
    return first, Comparison(ratios, clock, plain_tokens, same, dtype in (torch.bfloat16, torch.float16), spans)


def plain_options(options: dict) -> dict:
    """The speculative call's options that plain decoding takes too (sampling and stopping, not drafting)."""
    return {key: value for key, value in options.items() if key in ("temperature", "top_k", "eos")}


def speed_line(span: Span, tokens: int) -> str:
    """tokens/s of one run on both clocks, flagged when contended."""
    wall = tokens / span.wall_s if span.wall_s > 0 else float("nan")
    cpu = tokens / span.thread_cpu_s if span.thread_cpu_s > 0 else float("nan")
    return f"tokens/s: {wall:.1f} (wall), {cpu:.1f} (worker CPU)" + ("  CONTENDED: compare the CPU figure" if span.contended else "")

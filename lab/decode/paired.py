"""Paired speed ratios: plain and speculative decoding of the same prompt, measured back to back.

A change of machine load between two long measurements moves one side and not the other; two
requests run one right after the other see nearly the same machine. So each (prompt, repeat)
pair gives one ratio of speeds,

    speedup = (tokens_spec / time_spec) / (tokens_plain / time_plain)

over the whole request (prefill included: it is the same prompt on both sides), from wall time
and from the worker thread's CPU time, and the headline is the median over pairs with the
quartiles as its spread. The order inside a pair alternates (plain first, then speculative first),
so whatever favours the second run of a pair (warm caches) favours neither side on balance.
"""

from __future__ import annotations

import statistics

from lab.tracking.timing import Span


def pair_order(prompt_index: int, repeat: int) -> tuple[bool, bool]:
    """Which side runs first: (False, True) = plain then speculative; alternates over prompts and repeats."""
    return (False, True) if (prompt_index + repeat) % 2 == 0 else (True, False)


def speed_ratio(tokens_spec: int, spec: Span, tokens_plain: int, plain: Span, clock: str) -> float:
    """Speculative ÷ plain tokens per second on one clock ("wall" or "cpu": the worker thread's CPU time)."""
    seconds = {"wall": lambda s: s.wall_s, "cpu": lambda s: s.thread_cpu_s}[clock]
    if min(seconds(spec), seconds(plain)) <= 0:
        return float("nan")
    return (tokens_spec / seconds(spec)) / (tokens_plain / seconds(plain))


def median_quartiles(values: list[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile); one value is its own quartiles."""
    values = sorted(v for v in values if v == v)
    if not values:
        nan = float("nan")
        return nan, nan, nan
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return median, q1, q3


def paired_metrics(pairs: list[tuple[int, Span, int, Span]], prefix: str = "decode/speedup") -> dict:
    """`prefix` (wall-time median), `_q1`, `_q3`, and the same from CPU time (`prefix_cpu*`), over the pairs
    (tokens_spec, spec span, tokens_plain, plain span); `decode/pairs` counts them."""
    out = {"decode/pairs": float(len(pairs))}
    for clock, suffix in (("wall", ""), ("cpu", "_cpu")):
        median, q1, q3 = median_quartiles([speed_ratio(*pair, clock) for pair in pairs])
        out.update({f"{prefix}{suffix}": median, f"{prefix}{suffix}_q1": q1, f"{prefix}{suffix}_q3": q3})
    return out

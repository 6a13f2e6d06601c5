"""Loss spikes: isolated jumps in a training curve, found against a running median.

A step is a spike when its value exceeds the median of its neighbourhood (a centred window)
by more than `SPIKE_SIGMAS` robust standard deviations of the curve's residuals *and* by more
than `SPIKE_MIN_NATS`. The running median follows a falling loss curve exactly (the median of
a monotone window is its centre), so the fast early descent is not a spike; a single step that
jumps to 10 nats on a curve at 2.6 is one. The same rule feeds the report's findings and keeps
the per-horizon figure's y-range from being stretched by such a step.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

SPIKE_WINDOW = 9  # steps in the centred running-median window (odd)
SPIKE_SIGMAS = 6.0  # robust standard deviations above the running median
SPIKE_MIN_NATS = 0.5  # and at least this far above it
MAD_TO_SD = 1.4826  # median absolute deviation → standard deviation for a normal law


@dataclass(frozen=True)
class Spike:
    step: int
    value: float
    baseline: float  # running median around the step

    @property
    def size(self) -> float:
        return self.value - self.baseline


def running_median(values: list[float], window: int = SPIKE_WINDOW) -> list[float]:
    """Median of a window centred on each point; near the ends the window shrinks symmetrically
    (a one-sided window on a falling curve would sit above the first points and call them spikes),
    so the first and last points are their own median and are never spikes."""
    n = len(values)
    out = []
    for i in range(n):
        radius = min(window // 2, i, n - 1 - i)
        out.append(statistics.median(values[i - radius: i + radius + 1]))
    return out


def find_spikes(series: list[tuple[int, float]], *, sigmas: float = SPIKE_SIGMAS, min_size: float = SPIKE_MIN_NATS) -> list[Spike]:
    """Spikes of one (step, value) series, in step order. Fewer than 5 points: none (nothing to compare with)."""
    if len(series) < 5:
        return []
    steps = [step for step, _ in series]
    values = [value for _, value in series]
    baseline = running_median(values)
    residuals = [v - b for v, b in zip(values, baseline)]
    spread = MAD_TO_SD * statistics.median(abs(r) for r in residuals)
    threshold = max(sigmas * spread, min_size)
    return [Spike(s, v, b) for s, v, b, r in zip(steps, values, baseline, residuals) if r > threshold]


def robust_range(values: list[float], margin: float = 0.05) -> tuple[float, float] | None:
    """(low, high) covering every (already de-spiked) value, padded by `margin` of the span."""
    kept = [v for v in values if math.isfinite(v)]
    if not kept:
        return None
    low, high = min(kept), max(kept)
    pad = margin * (high - low) if high > low else max(abs(high) * margin, 1e-3)
    return low - pad, high + pad


def train_loss_metrics(history: dict) -> list[str]:
    """The per-horizon training losses of a job (`train/loss` alone when it logged no horizons)."""
    names = sorted((n for n in history if n.startswith("train/loss/h") and n[len("train/loss/h"):].isdigit()),
                   key=lambda n: int(n[len("train/loss/h"):]))
    return names or (["train/loss"] if "train/loss" in history else [])


def record_spikes(records: list[dict]) -> list[tuple[dict, str, Spike]]:
    """(record, metric, spike) for every spike in every job's training losses, in job then step order."""
    out = []
    for record in records:
        for metric in train_loss_metrics(record["history"]):
            series = [(step, value) for step, value in record["history"][metric] if math.isfinite(value)]
            out += [(record, metric, spike) for spike in find_spikes(series)]
    return out

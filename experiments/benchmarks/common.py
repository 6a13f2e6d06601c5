"""Shared helpers for the benchmark scripts: interleaved A/B timing and plain-text tables.

Variants are timed side by side in one process: after warm-up, every round runs each
variant once, in an order rotated from round to round, so slow drifts (thermal state,
allocator growth, other load) spread evenly over all variants. Report the median and
the interquartile range of the per-call times.
"""

from __future__ import annotations

import os

# Import this module before torch. On a shared 2-core machine the default OpenMP
# spin-wait turns every parallel region into a wait for a descheduled thread (a tiny
# model's step measured 8x slower with 2 threads than with 1 under load); passive
# waiting keeps 2-thread timings meaningful. An explicit setting is respected.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Timing:
    """Summary of one variant's per-call wall times (seconds)."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def iqr(self) -> tuple[float, float]:
        """(first quartile, third quartile); both equal the value for a single sample."""
        if len(self.samples) < 2:
            return self.samples[0], self.samples[0]
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q1, q3

    def describe(self, scale: float = 1.0, digits: int = 3) -> str:
        """'median [q1–q3]', values multiplied by `scale`."""
        q1, q3 = self.iqr
        return f"{self.median * scale:.{digits}f} [{q1 * scale:.{digits}f}–{q3 * scale:.{digits}f}]"

    def ms(self) -> str:
        return self.describe(1e3, 1)


def interleave(variants: dict[str, Callable[[], object]], repeats: int, warmup: int = 1,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Time `fn()` of every variant `repeats` times in rotated round-robin order, after `warmup` rounds.
    `clock`: wall time by default; `time.thread_time` measures this thread's CPU time (a shared machine's
    other load does not count; with torch on one thread it is all the step's compute)."""
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(warmup + repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = clock()
            variants[name]()
            elapsed = clock() - start
            if round_index >= warmup:
                samples[name].append(elapsed)
    return {name: Timing(values) for name, values in samples.items()}


def compose(*overrides: str, output_dir: str = "/tmp/mtp-lab-benchmark"):
    """The real `lab-train` config (conf/train.yaml) with `overrides`, composed by Hydra as the CLI does."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from lab.config.resolvers import register_resolvers
    from lab.train import CONF_DIR

    register_resolvers()  # ${lab.wandb_dir:...} and friends, as lab-train registers them
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return hydra_compose("train", overrides=[*overrides, f"paths.output_dir={output_dir}"])


def fit_announced(trainer, module, datamodule, heading: str) -> float:
    """Print what is measured, fit the module; returns when the fit began (perf_counter), for the closing total."""
    print(heading)
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    return start


def paired_ratio(a: Timing, b: Timing) -> Timing:
    """Ratios a_i / b_i of samples taken in the same interleaved round.

    Neighbours in time share the machine's state, so their ratio cancels slow load
    drift that the ratio of medians still carries.
    """
    return Timing([x / y for x, y in zip(a.samples, b.samples, strict=True)])


def cpu_clock() -> Callable[[], float]:
    """CPU seconds of what torch computes: this thread's with one intra-op thread, the process's with more (a shared
    machine's other processes count in neither; wall time would count them)."""
    import torch

    return time.thread_time if torch.get_num_threads() == 1 else time.process_time


def use_cpu_clock_for_decoding() -> None:
    """`Generation.stats` times (prefill, draft, verify, total) in CPU time instead of wall time."""
    import lab.decode.generate as generate

    generate.CLOCK = cpu_clock()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table, columns right-aligned except the first."""
    cells = [[str(h) for h in headers]] + [[_fmt(value) for value in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"

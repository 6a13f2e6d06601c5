"""Gradient conflict between horizons, from the runs' logged `grad/cos/...` histories.

The gradient diagnostics callback (lab/callbacks/grad_diagnostics.py) logs the cosine of ∇L_i and
∇L_j for every horizon pair i < j, in the trunk-output space (`grad/cos/h{i}_h{j}`, no prefix) and
in each named parameter group (`grad/cos/{group}/h{i}_h{j}`). This module turns those series into

- `conflict_series(variant)`: per space and pair, the cosine over training — mean over seeds at the
  steps every seed logged, with the sd over seeds — for the report's and the paper's figure;
- `gradient_conflict_findings(variants)`: the sentences the report (report.md/html), the wandb
  Report and `analysis.paper_figures` print: per variant the sign of the mean cosine and its trend
  (mean over the first third of the logged steps against the last third, Δ ± sd over seeds), and
  per space and pair the variants side by side over the last third of training.

Spaces are named for what they are: the unprefixed (or `leaf`) space is the trunk output the heads
read. Two groups whose cosines are equal at every logged step of every run are one tensor (tied
embedding and unembedding: `embed` and `unembed` name the same Parameter): they are shown once,
labelled `embed = unembed (tied)`.

The trend test: a seed's series is split into thirds by logged step; Δ = mean(last third) −
mean(first third). Over n seeds, Δ is "rising" / "falling" when |mean Δ| exceeds both
`TREND_MIN` and 2 standard errors (sd/√n); with one seed only the first bound applies (no spread
to test against, and the sentence says so).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass

import numpy as np

from lab.report.records import finite
from lab.report.table import order_key

GRAD_COS = re.compile(r"^grad/cos/(?:(?P<space>.+)/)?h(?P<i>\d+)_h(?P<j>\d+)$")
LEAF_SPACES = ("", "leaf")  # the callback logs the trunk output without a prefix; older fixtures name it `leaf`
TRUNK_OUTPUT = "trunk output"
TREND_MIN = 0.02  # |Δ| below this is "flat" whatever the seed spread
SIGN_MIN = 0.01  # |mean cosine| below this is "near zero"


def space_label(space: str | None) -> str:
    """What a grad/cos space is: the trunk output for the unprefixed (`leaf`) space, else the parameter group's name."""
    return TRUNK_OUTPUT if (space or "") in LEAF_SPACES else str(space)


@dataclass(frozen=True)
class PairSeries:
    """One variant's cosine of one horizon pair in one space, over training."""

    space: str  # display label: "trunk output", a group name, or "embed = unembed (tied)"
    pair: tuple[int, int]
    steps: np.ndarray  # steps every seed logged (finite)
    mean: np.ndarray  # mean over seeds per step
    sd: np.ndarray  # sample sd over seeds per step (0 with one seed)
    per_seed: list[dict]  # per seed: {"mean", "early", "late"} over its own logged steps

    @property
    def seeds(self) -> int:
        return len(self.per_seed)

    @property
    def pair_label(self) -> str:
        return f"h{self.pair[0]}–h{self.pair[1]}"

    def stat(self, key: str) -> tuple[float, float, int]:
        """(mean, sd, n) over seeds of a per-seed summary ("mean", "early", "late" or "delta")."""
        values = [s["late"] - s["early"] if key == "delta" else s[key] for s in self.per_seed]
        return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values)


def finite_series(record: dict, name: str) -> list[tuple[int, float]]:
    return [(int(step), float(value)) for step, value in record["history"].get(name, []) if finite(value)]


def thirds(values: list[float]) -> tuple[float, float]:
    """(mean of the first third, mean of the last third) of a series (at least one point each)."""
    size = max(1, len(values) // 3)
    return statistics.fmean(values[:size]), statistics.fmean(values[-size:])


def tied_groups(records: list[dict], spaces: dict[str, list[str]]) -> dict[str, list[str]]:
    """Spaces whose cosines are equal at every logged step of every record → merged under one label ("a = b (tied)")."""
    def signature(space: str) -> tuple:
        names = sorted(spaces[space], key=lambda n: (int(GRAD_COS.match(n).group("i")), int(GRAD_COS.match(n).group("j"))))
        pairs = tuple((GRAD_COS.match(n).group("i"), GRAD_COS.match(n).group("j")) for n in names)
        return pairs, tuple(tuple(tuple(finite_series(r, n)) for n in names) for r in records)

    merged: dict[str, list[str]] = {}
    seen: dict[tuple, str] = {}
    for space in spaces:
        if space in LEAF_SPACES:
            merged[space] = [space]
            continue
        sig = signature(space)
        logged = any(series for per_record in sig[1] for series in per_record)
        if logged and sig in seen:
            merged[seen[sig]].append(space)
        else:
            seen.setdefault(sig, space)
            merged[space] = [space]
    return merged


def conflict_series(records: list[dict]) -> list[PairSeries]:
    """Every (space, pair) the records logged at ≥ 1 step, tied groups once; spaces: trunk output first, then groups."""
    names = sorted({name for r in records for name in r["history"] if GRAD_COS.match(name)})
    spaces: dict[str, list[str]] = {}
    for name in names:
        spaces.setdefault(GRAD_COS.match(name).group("space") or "", []).append(name)
    out = []
    order = sorted(spaces, key=lambda s: (s not in LEAF_SPACES, s))
    merged = tied_groups(records, {s: spaces[s] for s in order})
    for space, members in merged.items():
        label = space_label(space) if len(members) == 1 else " = ".join(members) + " (tied)"
        for name in spaces[space]:
            match = GRAD_COS.match(name)
            series = [finite_series(r, name) for r in records]
            series = [s for s in series if s]
            if not series:
                continue
            by_step: dict[int, list[float]] = {}
            for s in series:
                for step, value in s:
                    by_step.setdefault(step, []).append(value)
            steps = sorted(step for step, values in by_step.items() if len(values) == len(series))
            per_seed = []
            for s in series:
                values = [v for _, v in s]
                early, late = thirds(values)
                per_seed.append({"mean": statistics.fmean(values), "early": early, "late": late})
            out.append(PairSeries(
                label, (int(match.group("i")), int(match.group("j"))), np.array(steps, dtype=float),
                np.array([statistics.fmean(by_step[s]) for s in steps], dtype=float),
                np.array([statistics.stdev(by_step[s]) if len(by_step[s]) > 1 else 0.0 for s in steps], dtype=float),
                per_seed,
            ))
    return sorted(out, key=lambda p: (p.space != TRUNK_OUTPUT, p.space, p.pair))


def sign_word(value: float) -> str:
    if value > SIGN_MIN:
        return "positive"
    if value < -SIGN_MIN:
        return "negative"
    return "near zero"


def trend_word(series: PairSeries) -> str:
    delta, sd, n = series.stat("delta")
    bound = max(TREND_MIN, 2 * sd / math.sqrt(n)) if n > 1 else TREND_MIN
    if abs(delta) <= bound:
        return "flat"
    return "rising" if delta > 0 else "falling"


def signed(value: float) -> str:
    return f"{value:+.2f}".replace("-", "−")


def pair_clause(series: PairSeries) -> str:
    """`h1–h2 −0.20 → +0.10 (negative then positive, rising; Δ +0.30 ± 0.02)`."""
    early, _, _ = series.stat("early")
    late, _, _ = series.stat("late")
    delta, sd, n = series.stat("delta")
    signs = sign_word(early) if sign_word(early) == sign_word(late) else f"{sign_word(early)} then {sign_word(late)}"
    spread = f" ± {sd:.2f}" if n > 1 else ""
    return f"{series.pair_label} {signed(early)} → {signed(late)} ({signs}, {trend_word(series)}; Δ {signed(delta)}{spread})"


def variant_finding(label: str, series: list[PairSeries]) -> str:
    seeds = max(s.seeds for s in series)
    overall = statistics.fmean(s.stat("mean")[0] for s in series)
    by_space: dict[str, list[PairSeries]] = {}
    for s in series:
        by_space.setdefault(s.space, []).append(s)
    parts = [f"{space}: " + ", ".join(pair_clause(s) for s in pairs) for space, pairs in by_space.items()]
    spread = f"Δ ± sd over {seeds} seeds" if seeds > 1 else "one seed: no spread, flat when |Δ| ≤ " + f"{TREND_MIN:g}"
    return (f"Gradient cosine between horizons, **{label}** (mean cosine over all pairs and spaces {signed(overall)}, "
            f"{sign_word(overall)}; first third → last third of the logged steps, {spread}): " + "; ".join(parts) + ".")


def comparison_finding(by_variant: dict[str, list[PairSeries]]) -> list[str]:
    """Per space and pair logged by ≥ 2 variants: each variant's last-third mean (± sd over seeds) and whether they
    differ by more than 2 standard errors of the difference (the largest against the smallest)."""
    keys = sorted({(s.space, s.pair) for series in by_variant.values() for s in series},
                  key=lambda key: (key[0] != TRUNK_OUTPUT, key[0], key[1]))
    parts = []
    for space, pair in keys:
        rows = [(label, s) for label, series in by_variant.items() for s in series if (s.space, s.pair) == (space, pair)]
        if len(rows) < 2:
            continue
        stats = [(label, *s.stat("late")) for label, s in rows]
        cells = ", ".join(f"{label} {signed(m)}" + (f" ± {sd:.2f}" if n > 1 else "") for label, m, sd, n in stats)
        high, low = max(stats, key=lambda row: row[1]), min(stats, key=lambda row: row[1])
        if high[3] > 1 and low[3] > 1:
            se = math.sqrt(high[2] ** 2 / high[3] + low[2] ** 2 / low[3])
            verdict = "differ by more than 2 se" if high[1] - low[1] > max(2 * se, TREND_MIN) else "within 2 se: a tie"
        else:
            verdict = "one seed: no noise estimate"
        parts.append(f"{space} h{pair[0]}–h{pair[1]}: {cells} ({verdict})")
    if not parts:
        return []
    return ["Gradient cosine by variant over the last third of training (does the variant change the conflict?): " + "; ".join(parts) + "."]


def gradient_conflict_findings(variants) -> list[str]:
    """The report's gradient-conflict sentences (module docstring); [] when no variant logged a cosine."""
    by_variant = {}
    for variant in sorted(variants, key=order_key):
        series = conflict_series(variant.ok)
        if series:
            by_variant[variant.label] = series
    if not by_variant:
        return []
    return [variant_finding(label, series) for label, series in by_variant.items()] + comparison_finding(by_variant)

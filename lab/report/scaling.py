"""The scaling section of a sweep report: loss difference to ntp and tokens per forward against parameters.

Drawn when the sweep varies an override named `size` (experiments/scaling.yaml). Within one size,
each variant's next-token validation loss (`val/loss`) is compared with the ntp variant's on the
same seed: Δ_seed = loss(variant, size, seed) − loss(ntp, size, seed), reported as mean ± sample
sd over the seeds both completed (negative = the multi-token variant is better). Parameters are
each variant's own `params_total` (run.json cost), so the x-axis is the model that was trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lab.report.labels import readable
from lab.report.plotting import figure, save_png, short, variant_style
from lab.report.records import finite, override_items
from lab.report.sweep_figures import ReportFigure
from lab.report.table import SEED_KEYS, Variant, mean_spread

SIZE_KEY = "size"
LOSS = "val/loss"
TOKENS_PER_FORWARD = "val/est_tokens_per_forward"


@dataclass(frozen=True)
class ScalingPoint:
    method: str  # the variant's label without its size
    size: str
    baseline: bool  # the variant is the next-token baseline (its run.json head traits)
    params: float | None
    loss: float | None
    delta: tuple[float | None, float | None, int]  # (mean, sd, seeds) of the paired difference to ntp
    tokens_per_forward: float | None


def overrides_of(record: dict) -> dict[str, str]:
    return dict(override_items(record["overrides"]))


def size_of(variant: Variant) -> str | None:
    return overrides_of(variant.first).get(SIZE_KEY)


def seed_of(record: dict) -> str | None:
    values = overrides_of(record)
    return next((values[key] for key in SEED_KEYS if key in values), None)


def method_of(variant: Variant) -> str:
    return " ".join(part for part in variant.label.split() if not part.startswith(f"{SIZE_KEY}=")) or variant.label


def losses_by_seed(variant: Variant) -> dict[str | None, float]:
    return {seed_of(r): r["final"][LOSS] for r in variant.ok if finite(r["final"].get(LOSS))}


def scaling_points(variants: list[Variant]) -> list[ScalingPoint]:
    """One point per (variant, size), sizes ordered by the ntp baseline's parameters; [] without a `size` dimension."""
    sized = [v for v in variants if size_of(v) is not None]
    if len({size_of(v) for v in sized}) < 2:
        return []
    baselines = {size_of(v): v for v in sized if v.is_baseline}
    points = []
    for variant in sized:
        baseline = baselines.get(size_of(variant))
        deltas = []
        if baseline is not None:
            reference = losses_by_seed(baseline)
            deltas = [loss - reference[seed] for seed, loss in losses_by_seed(variant).items() if seed in reference]
        points.append(ScalingPoint(method_of(variant), size_of(variant), variant.is_baseline, variant.cost("params_total"),
                                   variant.stat(LOSS)[0], mean_spread(deltas), variant.stat(TOKENS_PER_FORWARD)[0]))
    size_params = {p.size: p.params for p in points if p.baseline}
    return sorted(points, key=lambda p: (size_params.get(p.size) or p.params or math.inf, not p.baseline, p.method))


def methods(points: list[ScalingPoint]) -> list[str]:
    return list(dict.fromkeys(p.method for p in points))


def fmt_delta(delta: tuple[float | None, float | None, int]) -> str:
    mean, sd, n = delta
    return "—" if mean is None else f"{mean:+.4f} ± {sd:.4f}"


def scaling_table(points: list[ScalingPoint]) -> tuple[list[str], list[list[str]]]:
    header = ["size", "variant", "params", "val/loss", "Δ val/loss to ntp (same seed)", "seeds paired", "est tokens/forward (val)"]
    rows = [[p.size, p.method, "—" if p.params is None else f"{p.params / 1e6:.3f} M", "—" if p.loss is None else f"{p.loss:.4f}",
             fmt_delta(p.delta), str(p.delta[2]), "—" if p.tokens_per_forward is None else f"{p.tokens_per_forward:.2f}"]
            for p in points]
    return header, rows


def scaling_finding(points: list[ScalingPoint]) -> list[str]:
    parts = []
    for method in methods(points):
        line = [p for p in points if p.method == method and not p.baseline and p.delta[0] is not None]
        if line:
            parts.append(f"{method}: " + ", ".join(f"{p.size} ({p.params / 1e6:.2f} M) {fmt_delta(p.delta)}" for p in line))
    if not parts:
        return []
    return ["Scaling: next-token validation loss difference to ntp of the same size and seed (mean ± sd over seeds; negative = "
            "better than ntp): " + "; ".join(parts) + "."]


def loss_difference_figure(points: list[ScalingPoint], path: Path) -> Path | None:
    lines = [(m, [p for p in points if p.method == m and not p.baseline and p.delta[0] is not None and p.params]) for m in methods(points)]
    return line_figure(lines, path, lambda p: p.delta[0], lambda p: p.delta[1], "Δ val next-token loss to ntp (nats)",
                       "Multi-token prediction vs ntp by model size\n(same seed pairs; mean ± sd over seeds; below 0 = better)")


def tokens_per_forward_figure(points: list[ScalingPoint], path: Path) -> Path | None:
    lines = [(m, [p for p in points if p.method == m and p.tokens_per_forward is not None and p.params]) for m in methods(points)]
    return line_figure(lines, path, lambda p: p.tokens_per_forward, None, "est. tokens per forward (val)",
                       "Self-speculative decoding estimate by model size\n(mean over seeds)")


def line_figure(lines, path: Path, y, error, ylabel: str, title: str) -> Path | None:
    """One line per method against parameters (log x); `error` gives error bars, and a zero line marks ntp."""
    lines = [(method, line) for method, line in lines if line]
    if not lines:
        return None
    with figure(6.5, 4.0) as (fig, axes):
        ax = axes[0][0]
        for index, (method, line) in enumerate(lines):
            colour, style = variant_style(index)
            ax.errorbar([p.params for p in line], [y(p) for p in line], yerr=None if error is None else [error(p) for p in line],
                        color=colour, linestyle=style, marker="o", capsize=3, label=short(readable(method), 32))
        if error is not None:
            ax.axhline(0.0, color="black", linestyle="--", linewidth=0.8, label="ntp")
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return save_png(fig, path)


SCALING_FIGURES = (
    ("scaling_loss_difference.png", loss_difference_figure, "Next-token loss difference to ntp against parameters"),
    ("scaling_tokens_per_forward.png", tokens_per_forward_figure, "Tokens per forward against parameters"),
)

def write_scaling_figures(variants: list[Variant], out_dir) -> list[ReportFigure]:
    """The scaling figures of a sweep with a `size` dimension ([] otherwise)."""
    points = scaling_points(variants)
    if not points:
        return []
    out = []
    for name, draw, caption in SCALING_FIGURES:
        path = draw(points, Path(out_dir) / name)
        out.append(ReportFigure(name, caption, path, None if path else "no such metric in this sweep"))
    return out

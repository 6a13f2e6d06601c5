"""The sweep report's figures. Each returns the PNG path, or None when the sweep has no data for it.

Seeds are averaged: bars show the mean over a variant's completed jobs with the sample
standard deviation as error bar; curves show the per-step mean over seeds.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.patches import Patch

from lab.report.caveats import collapsed_horizons
from lab.report.plotting import figure, padded_range, save_png, short, style_map
from lab.report.records import finite
from lab.report.router_figures import expert_load_heatmaps
from lab.report.speeds import speedup_metric
from lab.report.spikes import find_spikes, robust_range
from lab.report.table import Variant, baseline_of, order_key

GRAD_COS = re.compile(r"^grad/cos/(?:(?P<space>.+)/)?h(?P<i>\d+)_h(?P<j>\d+)$")
MiB = 1024 * 1024


def variant_styles(variants: list[Variant]) -> dict[str, tuple[str, str]]:
    """(colour, line style) of every variant of the sweep, from its place in the head order (then K, then job order).

    Every figure takes its colours from this map of *all* the sweep's variants, so a variant has
    one colour in every figure, whichever subset a figure draws.
    """
    return style_map(v.label for v in sorted(variants, key=order_key))


def mean_curve(records: list[dict], metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-step mean of one metric over several jobs (steps every job logged)."""
    steps, means, _, _ = mean_sd_curve(records, metric)
    return steps, means


def mean_sd_curve(records: list[dict], metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(steps, mean, sample sd, n) of one metric over several jobs, at the steps every job logged (sd 0 for one job)."""
    by_step: dict[int, list[float]] = {}
    for record in records:
        for step, value in record["history"].get(metric, []):
            if finite(value):
                by_step.setdefault(step, []).append(value)
    steps = sorted(s for s, values in by_step.items() if len(values) == len(records))
    means = [statistics.fmean(by_step[s]) for s in steps]
    sds = [statistics.stdev(by_step[s]) if len(by_step[s]) > 1 else 0.0 for s in steps]
    return np.array(steps, dtype=float), np.array(means, dtype=float), np.array(sds, dtype=float), len(records)


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or len(values) < window:
        return values
    kernel = np.ones(window) / window
    padded = np.concatenate([np.full(window - 1, values[0]), values])
    return np.convolve(padded, kernel, mode="valid")


def history_mean(records: list[dict], metric: str, last_fraction: float = 1.0) -> float | None:
    """Mean of a metric over the last `last_fraction` of each job's logged steps, then over jobs."""
    per_job = []
    for record in records:
        series = [v for _, v in record["history"].get(metric, []) if finite(v)]
        if series:
            tail = series[int(len(series) * (1 - last_fraction)):] or series
            per_job.append(statistics.fmean(tail))
    return statistics.fmean(per_job) if per_job else None


def history_median(records: list[dict], metric: str) -> float | None:
    values = [v for r in records for _, v in r["history"].get(metric, []) if finite(v)]
    return statistics.median(values) if values else None


# ---- figures ---------------------------------------------------------------------------------


def val_loss_by_architecture(variants: list[Variant], path: Path) -> Path | None:
    """Bar per variant (ordered by architecture, then K) in the variant's colour; ntp as a dashed baseline.

    The y-axis starts at zero (a bar's height is its value): differences between variants are
    written on the bars as Δ to ntp instead of being magnified by a cut axis.
    """
    rows = [v for v in sorted(variants, key=order_key) if v.stat("val/loss")[0] is not None]
    if not rows:
        return None
    styles = variant_styles(variants)
    chosen = baseline_of(rows)  # none in the sweep (or several): no Δ is written
    baseline = None if chosen is None else chosen.stat("val/loss")[0]
    with figure(max(5.0, 0.75 * len(rows) + 2), 4.0) as (fig, axes):
        ax = axes[0][0]
        for i, variant in enumerate(rows):
            mean, spread, n = variant.stat("val/loss")
            ax.bar(i, mean, yerr=spread if n > 1 else None, capsize=3, color=styles[variant.label][0])
            text = f"{mean:.3f}" if baseline is None or variant is chosen else f"{mean:.3f}\nΔ{mean - baseline:+.3f}"
            ax.annotate(text, (i, mean + (spread or 0)), ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
        if baseline is not None:
            ax.axhline(baseline, color="black", linestyle="--", linewidth=0.8, label=f"baseline: {short(chosen.label, 24)}")
        high = max(v.stat("val/loss")[0] + (v.stat("val/loss")[1] or 0) for v in rows)
        ax.set_ylim(*zero_based_ylim(high))
        ax.set_xticks(range(len(rows)), [short(v.label) for v in rows], rotation=30, ha="right")
        ax.set_ylabel("val next-token loss (nats)")
        seeds = sorted({v.stat("val/loss")[2] for v in rows})
        spread = f"mean ± sd over n = {'/'.join(map(str, seeds))} seeds" if max(seeds) > 1 else "one seed each"
        ax.set_title("Validation next-token loss by variant\n(" + spread
                     + ("" if chosen is None else f"; Δ = difference to {short(chosen.label, 24)}") + ")")
        if baseline is not None:
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return save_png(fig, path)


def zero_based_ylim(high: float) -> tuple[float, float]:
    """A bar chart's y-range: from 0, with headroom for the value labels above the tallest bar."""
    return 0.0, max(high, 0.0) * 1.18 + 1e-9


def despiked_mean_curve(records: list[dict], metric: str) -> tuple[np.ndarray, np.ndarray, list[tuple[int, float]]]:
    """Per-step mean over jobs with each job's spikes replaced by their running median.

    Returns (steps, means, spikes) where spikes are the (step, raw value) pairs that were
    replaced: the figure draws them as explicit markers instead of letting them set the y-range.
    """
    cleaned, spikes = [], []
    for record in records:
        series = [(s, v) for s, v in record["history"].get(metric, []) if finite(v)]
        found = {spike.step: spike for spike in find_spikes(series)}
        spikes += [(spike.step, spike.value) for spike in found.values()]
        cleaned.append({"history": {metric: [(s, found[s].baseline if s in found else v) for s, v in series]}})
    steps, means = mean_curve(cleaned, metric)
    return steps, means, spikes


def horizon_loss_curves(variants: list[Variant], path: Path) -> Path | None:
    """One panel per horizon: training loss at horizon k over steps (smoothed), val loss as markers.

    Each variant has its own colour and line style. The y-range covers every curve except loss
    spikes (lab/report/spikes.py), which are drawn as triangles (clipped to the top edge, with
    their value written beside them) so one bad step cannot flatten every other curve.
    """
    rows = [v for v in sorted(variants, key=order_key) if v.ok]
    max_k = max((v.max_k for v in rows), default=0)
    if not rows or max_k < 1:
        return None
    ncols = min(max_k, 4)
    nrows = (max_k + ncols - 1) // ncols
    styles = variant_styles(variants)
    with figure(3.2 * ncols + 0.5, 2.8 * nrows + 0.6, nrows, ncols, sharex=True) as (fig, axes):
        drawn = False
        for k in range(1, max_k + 1):
            ax = axes[(k - 1) // ncols][(k - 1) % ncols]
            shown, spikes = [], []
            for variant in rows:
                line_color, line_style = styles[variant.label]
                steps, values, variant_spikes = despiked_mean_curve(variant.ok, f"train/loss/h{k}")
                if len(steps):
                    curve = smooth(values, max(1, len(values) // 25))
                    ax.plot(steps, curve, color=line_color, linestyle=line_style, linewidth=1.0, label=short(variant.label))
                    shown += list(curve)
                    drawn = True
                spikes += [(step, value, line_color) for step, value in variant_spikes]
                vsteps, vvalues = mean_curve(variant.ok, f"val/loss/h{k}")
                if len(vsteps):
                    ax.plot(vsteps, vvalues, color=line_color, marker="o", markersize=3, linestyle="none")
                    shown += list(vvalues)
                    drawn = True
            limits = robust_range(shown)
            if limits is not None:
                ax.set_ylim(*limits)
                for step, value, spike_color in spikes:
                    y = min(value, limits[1])
                    ax.plot([step], [y], marker="^", color=spike_color, markersize=6, linestyle="none", clip_on=False)
                    ax.annotate(f"spike {value:.2f}", (step, y), fontsize=6, xytext=(3, -8), textcoords="offset points")
            ax.set_title(f"horizon {k}")
            ax.set_xlabel("step")
            ax.set_ylabel("loss (nats)")
        for k in range(max_k + 1, nrows * ncols + 1):
            axes[(k - 1) // ncols][(k - 1) % ncols].set_visible(False)
        if not drawn:
            return None
        if axes[0][0].get_legend_handles_labels()[0]:
            axes[0][0].legend(loc="upper right")
        fig.suptitle("Per-horizon loss: train (lines, smoothed) and validation (dots); ▲ = loss spike")
        return save_png(fig, path)


def draw_horizon_metric(ax, rows: list[Variant], styles: dict, metric: str, first_k: int, suffix: str = "h") -> bool:
    """`{metric}/{suffix}{k}` against k, one line per variant (mean ± sd over seeds); whether anything was drawn."""
    drawn = False
    for variant in rows:
        ks, means, spreads = [], [], []
        for k in range(first_k, variant.max_k + 1):
            mean, spread, _ = variant.stat(f"{metric}/{suffix}{k}")
            if mean is not None:
                ks.append(k), means.append(mean), spreads.append(spread or 0.0)
        if ks:
            line_color, line_style = styles[variant.label]
            ax.errorbar(ks, means, yerr=spreads, color=line_color, linestyle=line_style, marker="o", markersize=3, capsize=2,
                        linewidth=1.0, label=short(variant.label))
            drawn = True
    ax.xaxis.get_major_locator().set_params(integer=True)
    return drawn


def horizon_panels(variants: list[Variant], path: Path, panels, *, first_k: int, ylabel: str, title: str,
                   suffix: str = "h", xlabel: str = "horizon k") -> Path | None:
    """One panel per (metric prefix, panel title): `{prefix}/{suffix}{k}` vs k per variant, mean ± sd over seeds."""
    rows = [v for v in sorted(variants, key=order_key) if v.stat(f"{panels[0][0]}/{suffix}{first_k}")[0] is not None]
    if not rows:
        return None
    styles = variant_styles(variants)
    with figure(10.0, 3.8, 1, len(panels)) as (fig, axes):
        for col, (prefix, panel_title) in enumerate(panels):
            ax = axes[0][col]
            draw_horizon_metric(ax, rows, styles, prefix, first_k, suffix)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_title(panel_title)
        axes[0][0].legend()
        fig.suptitle(title)
        return save_png(fig, path)


ACCURACY_GROUPS = (
    (False, "blind heads: horizon k predicts t+k from position t"),
    (True, "DeepSeek depths: teacher-forced (true tokens up to t+k−1)"),
)


def horizon_accuracy(variants: list[Variant], path: Path) -> Path | None:
    """Medusa-style: top-1 validation accuracy of horizon k vs k, and chain acceptance.

    Teacher-forced heads (DeepSeek depths) get their own row of panels: their accuracy answers
    an easier question than a blind head's (they see the true tokens before t+k), so the two never share an axis.
    """
    measured = [v for v in sorted(variants, key=order_key) if v.stat("val/acc/h1")[0] is not None]
    groups = [(title, [v for v in measured if v.teacher_forced == forced]) for forced, title in ACCURACY_GROUPS]
    groups = [(title, rows) for title, rows in groups if rows]
    if not groups:
        return None
    styles = variant_styles(variants)
    panels = (("val/acc", "top-1 accuracy of horizon k"), ("val/chain_acc", "P(k correct | 1..k-1 correct)"))
    with figure(10.0, 3.6 * len(groups) + 0.4, len(groups), 2) as (fig, axes):
        for row, (group_title, rows) in enumerate(groups):
            for col, (metric, panel_title) in enumerate(panels):
                ax = axes[row][col]
                draw_horizon_metric(ax, rows, styles, metric, 1)
                ax.set_xlabel("horizon k")
                ax.set_ylabel("accuracy")
                ax.set_title(f"{panel_title}\n{group_title}", fontsize=8)
            axes[row][0].legend()
        fig.suptitle("Per-horizon validation accuracy (final, mean ± sd over seeds)")
        return save_png(fig, path)


def draft_agreement(variants: list[Variant], path: Path) -> Path | None:
    """Agreement of horizon k's top-1 with the next-token path's (greedy draft acceptance estimate)."""
    panels = (("val/agree", "P(argmax_k[t] = argmax_1[t+k-1])"), ("val/agree_chain", "the same, given agreement at 2..k-1"))
    title = "Draft agreement by horizon (validation; DeepSeek depths are teacher-forced, an upper estimate)"
    return horizon_panels(variants, path, panels, first_k=2, ylabel="agreement", title=title)


# The bars of the live-decoding panel: (metric, legend label, hatch, filled).
LIVE_BARS = (
    ("decode/tokens_per_forward", "live, T=1 sampling (headline; degenerate prompts excluded)", None, True),
    ("decode/greedy/tokens_per_forward", "live, greedy (degenerate prompts excluded)", "////", True),
    ("val/est_tokens_per_forward", "validation estimate (greedy agreement)", None, False),
)


def live_decoding(variants: list[Variant], path: Path) -> Path | None:
    """End-of-training decoding (DecodingEval): acceptance by draft position both ways, and tokens/forward.

    The headline is exact speculative sampling at T = 1 over the prompts whose continuation is
    not degenerate; each variant's bar carries its distinct-4-gram ratio and how
    many prompts were flagged degenerate, so a repeated-token continuation cannot pass as speed.
    """
    decoded = lambda v: any(v.stat(m)[0] is not None for m in ("decode/distinct4", "decode/accept/p1"))  # noqa: E731 (older runs log no distinct4)
    rows = [v for v in sorted(variants, key=order_key) if v.max_k > 1 and decoded(v)]
    if not rows:
        return None
    styles = variant_styles(variants)
    with figure(15.0, max(4.2, 0.55 * len(rows) + 1.6), 1, 3) as (fig, axes):
        for ax, (metric, title, ylabel) in zip(axes[0][:2], (
            ("decode/accept", "unconditional: P(accepted prefix ≥ j)", "acceptance (T=1)"),
            ("decode/accept_cond", "conditional: P(j accepted | 1..j−1 accepted)", "acceptance (T=1)"),
        )):
            draw_horizon_metric(ax, rows, styles, metric, 1, suffix="p")
            ax.set_xlabel("draft position j")
            ax.set_ylabel(ylabel)
            shown = [y for line in ax.lines for y in line.get_ydata()]
            limits = padded_range(shown, pad=0.12, minimum_span=0.05)
            if limits is not None:
                ax.set_ylim(max(limits[0], 0.0), min(limits[1], 1.02))
            ax.set_title(title, fontsize=8)
        axes[0][0].legend()
        live_decoding_bars(axes[0][2], rows, styles)
        fig.suptitle("Live self-speculative decoding at the end of training (T=1 sampling is the headline; few prompts)")
        return save_png(fig, path)


def live_decoding_bars(ax, rows: list[Variant], styles: dict) -> None:
    """Tokens per target forward per variant, horizontal bars from zero: T=1 live, greedy live, validation estimate;
    each variant's distinct-4 ratio and degenerate share written under its name (rows, so notes never collide)."""
    height = 0.8 / len(LIVE_BARS)
    high = 1.0
    for b, (metric, label, hatch, filled) in enumerate(LIVE_BARS):
        for i, variant in enumerate(rows):
            mean, spread, _ = variant.stat(metric)
            y = i + (b - (len(LIVE_BARS) - 1) / 2) * height
            colour = styles[variant.label][0]
            if mean is None:
                continue
            ax.barh(y, mean, height=height, xerr=spread or None, capsize=2, color=colour if filled else "none", edgecolor=colour,
                    hatch=hatch, linewidth=1.0)
            high = max(high, mean + (spread or 0.0))
    ax.set_xlim(0.0, high * 1.1)
    ax.set_yticks(range(len(rows)), ["\n".join(filter(None, [short(v.label, 24), decoding_note(v)])) for v in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("tokens per target forward")
    ax.set_title("tokens per target forward\n(solid: T=1, hatched: greedy, outline: estimate)", fontsize=8)
    # The legend explains the bar kinds, not the variants (their colours are in the other panels): grey proxies.
    kinds = [Patch(facecolor="0.6" if filled else "none", edgecolor="0.3", hatch=hatch, label=short(label, 30))
             for _, label, hatch, filled in LIVE_BARS]
    ax.legend(handles=kinds, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=6)


def decoding_note(variant: Variant) -> str:
    """Under a variant's bars: distinct-4-gram ratio and degenerate share, T=1 then greedy ('d4 0.83, 25% degenerate')."""
    lines = []
    for prefix, mode in (("decode", "T=1"), ("decode/greedy", "greedy")):
        distinct, degenerate, clean = (variant.stat(f"{prefix}/{name}")[0] for name in ("distinct4", "degenerate", "prompts_clean"))
        if distinct is None:
            continue
        flag = "" if not degenerate else (", ALL DEGENERATE" if not clean else f", {degenerate:.0%} degenerate")
        lines.append(f"{mode}: d4 {distinct:.2f}{flag}")
    return "\n".join(lines)


@dataclass(frozen=True)
class LossSpeedup:
    """One variant's point: next-token validation loss against measured decoding speedup (mean, sd over seeds)."""

    variant: Variant
    loss: float
    loss_sd: float
    speedup: float
    speedup_sd: float
    measured: bool  # False: the variant cannot draft and decodes plainly (speedup 1 by definition)


def loss_speedup_points(variants: list[Variant]) -> list[LossSpeedup]:
    """Every variant with a validation loss and either a measured `decode/speedup` or no drafts (ntp: 1×)."""
    points = []
    for variant in sorted(variants, key=order_key):
        loss, loss_sd, _ = variant.stat("val/loss")
        speedup, speedup_sd, _ = variant.stat(speedup_metric(variant))  # CPU-time ratios when contended (lab.report.speeds)
        if loss is None or (speedup is None and variant.max_k > 1):
            continue
        measured = speedup is not None
        points.append(LossSpeedup(variant, loss, loss_sd or 0.0, speedup if measured else 1.0, speedup_sd or 0.0, measured))
    return points


def loss_vs_speedup(variants: list[Variant], path: Path) -> Path | None:
    """The trade-off MTP users ask about: next-token validation loss against measured speedup, one point per variant."""
    points = loss_speedup_points(variants)
    if not any(p.measured for p in points):
        return None
    styles = variant_styles(variants)
    with figure(7.5, 4.5) as (fig, axes):
        ax = axes[0][0]
        for p in points:
            colour = styles[p.variant.label][0]
            ax.errorbar([p.speedup], [p.loss], xerr=[p.speedup_sd], yerr=[p.loss_sd], color=colour, marker="o" if p.measured else "s",
                        markersize=6, capsize=2, linestyle="none", label=short(p.variant.label) + ("" if p.measured else " (plain)"))
            collapsed = collapsed_horizons(p.variant)  # a speedup drawn from one-id drafts is said on the point itself
            note = f" ({'/'.join(f'h{k}' for k in collapsed)} 1-id)" if collapsed else ""
            ax.annotate(short(p.variant.label, 20) + note, (p.speedup, p.loss), xytext=(4, 4), textcoords="offset points", fontsize=7)
        ax.axvline(1.0, color="black", linestyle=":", linewidth=0.8)
        ax.set_xlabel("measured decoding speedup (paired median of speculative / plain tokens/s, T=1; CPU time where contended)")
        ax.set_ylabel("val next-token loss (nats)")
        ax.set_title("Next-token loss vs self-speculative decoding speedup\n(lower right is better; mean ± sd over seeds)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return save_png(fig, path)


VAL_LOSS = "val/loss"


def seeds_phrase(counts) -> str:
    """'n = 2 seeds' / 'n = 2/3 seeds' / 'one seed'."""
    counts = sorted({c for c in counts if c})
    if not counts:
        return "no seed"
    return "one seed" if counts == [1] else f"n = {'/'.join(map(str, counts))} seeds"


def draw_val_loss_over_training(ax, rows: list[Variant], styles: dict, baseline: Variant | None = None) -> list[list]:
    """Validation next-token loss at every validation, one line per variant (mean over seeds), band ± sd over seeds;
    each legend entry states its n. Returns the CSV rows (variant, step, mean, sd, n)."""
    data, shown = [], []
    for variant in rows:
        steps, means, sds, n = mean_sd_curve(variant.ok, VAL_LOSS)
        if not len(steps):
            continue
        colour, style = styles[variant.label]
        tag = " (baseline)" if variant is baseline else ""
        ax.plot(steps, means, color=colour, linestyle=style, marker="o", markersize=3, linewidth=1.2,
                label=f"{short(variant.label, 24)}{tag} (n={n})")
        if n > 1:
            ax.fill_between(steps, means - sds, means + sds, color=colour, alpha=0.18, linewidth=0)
        shown += list(means - sds) + list(means + sds)
        data += [[variant.label, int(step), float(m), float(sd), n] for step, m, sd in zip(steps, means, sds)]
    limits = padded_range(shown)
    if limits is not None:
        ax.set_ylim(*limits)
    ax.set_xlabel("optimizer step (validation)")
    ax.set_ylabel("val next-token loss (nats)")
    return data


def val_loss_over_training(variants: list[Variant], path: Path) -> Path | None:
    """Validation loss over training with seed bands: mean over seeds, band ± sample sd, n in the legend."""
    rows = [v for v in sorted(variants, key=order_key) if v.ok and len(mean_sd_curve(v.ok, VAL_LOSS)[0]) > 1]
    if not rows:
        return NotDrawn("fewer than two validations logged (trainer.val_check_interval)")
    with figure(8.5, 4.2) as (fig, axes):
        ax = axes[0][0]
        draw_val_loss_over_training(ax, rows, variant_styles(variants), baseline_of(variants))
        counts = [len(v.ok) for v in rows]
        ax.set_title(f"Validation next-token loss over training\n(line: mean, band: ± sd over seeds; {seeds_phrase(counts)})")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return save_png(fig, path)


def draw_final_loss_dots(ax, rows: list[Variant], styles: dict, baseline: Variant | None) -> list[list]:
    """Final validation loss per variant, sorted best first: every seed a dot in the variant's colour, the mean a black
    bar, the baseline's mean a dashed line; the y tick names the variant with mean ± sd (n). Returns CSV rows."""
    rows = sorted(rows, key=lambda v: (v.stat(VAL_LOSS)[0], order_key(v)))
    data, shown = [], []
    for y, variant in enumerate(rows):
        values = variant.values(VAL_LOSS)
        colour = styles[variant.label][0]
        offsets = np.linspace(-0.15, 0.15, len(values)) if len(values) > 1 else np.zeros(1)
        ax.scatter(values, y + offsets[:len(values)], s=22, color=colour, edgecolor="white", linewidth=0.5, zorder=3)
        mean, sd, n = variant.stat(VAL_LOSS)
        ax.plot([mean, mean], [y - 0.32, y + 0.32], color="black", linewidth=2.0, zorder=4)
        shown += values
        data += [[variant.label, r.get("seed"), r["final"][VAL_LOSS], mean, sd, n, variant is baseline]
                 for r in variant.ok if finite(r["final"].get(VAL_LOSS))]
    if baseline is not None and baseline in rows:
        ax.axvline(baseline.stat(VAL_LOSS)[0], color="black", linestyle="--", linewidth=0.8, zorder=1)
    ticks = []
    for variant in rows:
        mean, sd, n = variant.stat(VAL_LOSS)
        spread = f"{mean:.3f} ± {sd:.3f} (n={n})" if n > 1 else f"{mean:.3f} (n=1)"
        ticks.append(f"{short(variant.label, 26)}{' — baseline' if variant is baseline else ''}\n{spread}")
    ax.set_yticks(range(len(rows)), ticks, fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    limits = padded_range(shown, pad=0.1)
    if limits is not None:
        ax.set_xlim(*limits)
    ax.set_xlabel("final val next-token loss (nats; lower is better)")
    return data


def final_loss_dots(variants: list[Variant], path: Path) -> Path | None:
    """Final validation loss, a row per variant sorted best first: every seed a dot, the mean a bar, the baseline dashed."""
    rows = [v for v in variants if v.stat(VAL_LOSS)[0] is not None]
    if not rows:
        return None
    chosen = baseline_of(variants)
    with figure(7.5, max(2.4, 0.55 * len(rows) + 1.3)) as (fig, axes):
        ax = axes[0][0]
        draw_final_loss_dots(ax, rows, variant_styles(variants), chosen)
        note = "dots: seeds, bar: mean" + ("" if chosen is None else f", dashed: baseline {short(chosen.label, 24)}")
        ax.set_title(f"Final validation loss per variant ({note})", fontsize=8)
        return save_png(fig, path)


def grad_cosine_heatmaps(variants: list[Variant], path: Path) -> Path | None:
    """Gradient cosine between horizons over training: one column per variant, one row per space (trunk output,
    parameter groups; tied groups once), mean over seeds with a ± sd band (lab/report/conflict_figure.py)."""
    from lab.report.conflict_figure import conflict_figure, conflict_panels, draw

    panels = conflict_panels(sorted(variants, key=order_key))
    if not panels:
        return None
    with conflict_figure(panels) as (fig, axes):
        draw(fig, axes, panels)
        return save_png(fig, path)


def effective_weights_by_policy(variants: list[Variant], path: Path) -> Path | NotDrawn | None:
    """Effective weight of each horizon in the objective (mean over training), grouped bars per variant.

    Not drawn when every bar would have the same height (e.g. head_mean with uniform λ at one K:
    every horizon weighs 1/K): the caption then states that weight instead.
    """
    rows = []
    for variant in sorted(variants, key=order_key):
        if variant.max_k < 2:
            continue
        weights = [history_mean(variant.ok, f"train/weight_eff/h{k}") for k in range(1, variant.max_k + 1)]
        if any(w is not None for w in weights):
            rows.append((variant, weights))
    if not rows:
        return None
    heights = [w for _, weights in rows for w in weights if w is not None]
    if max(heights) - min(heights) <= 1e-6 * max(abs(h) for h in heights) + 1e-12:
        return NotDrawn(f"every variant weights every horizon equally ({heights[0]:.4g}); nothing to compare")
    max_k = max(len(w) for _, w in rows)
    width = 0.8 / len(rows)
    styles = variant_styles(variants)
    with figure(max(6.0, 1.1 * max_k + 3), 3.8) as (fig, axes):
        ax = axes[0][0]
        for i, (variant, weights) in enumerate(rows):
            xs = [k - 1 + (i - (len(rows) - 1) / 2) * width for k in range(1, len(weights) + 1)]
            ax.bar(xs, [w if w is not None else 0.0 for w in weights], width=width, color=styles[variant.label][0],
                   label=short(f"{variant.label} [{variant.first.get('reduction')}, {variant.first.get('weights')}]", 48))
        ax.set_xticks(range(max_k), [f"h{k}" for k in range(1, max_k + 1)])
        ax.set_ylabel("effective weight (mean over steps)")
        ax.set_title("Effective horizon weights by policy")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
        return save_png(fig, path)


def logit_memory_by_schedule(variants: list[Variant], path: Path) -> Path | None:
    """Logical live-logit bytes and measured saved-tensor peak (median over steps) per variant.

    Two panels, each with its own x-axis: live logits are typically a few MiB while the saved
    tensors are tens to hundreds, so on one shared axis the live-logit bars would be invisible.
    """
    rows = []
    for variant in sorted(variants, key=order_key):
        live = history_median(variant.ok, "mem/logits_live_bytes")
        saved = history_median(variant.ok, "mem/saved_peak_bytes")
        if live is not None or saved is not None:
            rows.append((variant, live, saved))
    if not rows:
        return None
    styles = variant_styles(variants)
    with figure(10.0, max(2.5, 0.45 * len(rows) + 1.2), 1, 2, sharey=True) as (fig, axes):
        ys = np.arange(len(rows))
        panels = (("logits live (logical)", [live for _, live, _ in rows]), ("saved tensors peak (measured)", [saved for _, _, saved in rows]))
        for col, (title, values) in enumerate(panels):
            ax = axes[0][col]
            ax.barh(ys, [(value or 0) / MiB for value in values], height=0.6, color=[styles[v.label][0] for v, _, _ in rows])
            for y, value in zip(ys, values):
                ax.annotate("—" if value is None else f"{value / MiB:.2f}", (((value or 0) / MiB), y), va="center", fontsize=7,
                            xytext=(2, 0), textcoords="offset points")
            ax.set_xlabel("MiB (median over steps)")
            ax.set_title(title)
        axes[0][0].set_yticks(ys, [short(f"{v.label} [{v.first.get('schedule')}]", 40) for v, _, _ in rows])
        axes[0][0].invert_yaxis()
        fig.suptitle("Logit memory by backward schedule")
        return save_png(fig, path)


REPORT_FIGURES = (
    ("val_loss_by_architecture.png", val_loss_by_architecture, "Validation next-token loss by variant (architecture, K, …)"),
    ("final_loss_dots.png", final_loss_dots, "Final validation next-token loss per variant, best first: each seed a dot, "
     "the mean a bar, the baseline's mean dashed"),
    ("val_loss_over_training.png", val_loss_over_training, "Validation next-token loss over training: mean over seeds, "
     "band ± sd, n in the legend"),
    ("horizon_loss_curves.png", horizon_loss_curves, "Per-horizon loss curves"),
    ("horizon_accuracy.png", horizon_accuracy, "Per-horizon accuracy vs horizon (Medusa-style) and chain acceptance; "
     "teacher-forced DeepSeek depths on their own axes"),
    ("draft_agreement.png", draft_agreement, "Draft agreement by horizon per architecture (estimates greedy self-speculative acceptance)"),
    ("live_decoding.png", live_decoding, "Live decoding (T=1 headline): acceptance by draft position, unconditional and conditional, "
     "and tokens per target forward (T=1, greedy, validation estimate; distinct-4 and degenerate share under each variant)"),
    ("loss_vs_speedup.png", loss_vs_speedup, "Next-token validation loss vs measured decoding speedup, one point per variant"),
    ("grad_cosine.png", grad_cosine_heatmaps, "Gradient cosine between horizons over training, variants side by side "
     "(rows: trunk output, then parameter groups; tied groups once; band: ± sd over seeds)"),
    ("effective_weights.png", effective_weights_by_policy, "Effective horizon weights by policy"),
    ("logit_memory.png", logit_memory_by_schedule, "Logit memory by schedule"),
    ("expert_load.png", expert_load_heatmaps, "Expert load (load / mean load) by layer × expert, trunk layers and MTP depths side by side "
     "(MoE runs)"),
)


@dataclass(frozen=True)
class NotDrawn:
    """A figure left out of this sweep's report, with the reason the report prints instead."""

    reason: str


@dataclass(frozen=True)
class ReportFigure:
    name: str
    caption: str
    path: Path | None
    reason: str | None = None  # why it was not drawn (path is None)


def write_report_figures(variants: list[Variant], out_dir: Path) -> list[ReportFigure]:
    """Every report figure: drawn (path) or left out (reason)."""
    out = []
    for name, function, caption in REPORT_FIGURES:
        target = Path(out_dir) / name
        result = function(variants, target)
        if isinstance(result, Path):
            out.append(ReportFigure(name, caption, result))
            continue
        target.unlink(missing_ok=True)  # stale figure from an earlier build of a different sweep state (another report may remove it too)
        out.append(ReportFigure(name, caption, None, result.reason if isinstance(result, NotDrawn) else "no such metric in this sweep"))
    return out

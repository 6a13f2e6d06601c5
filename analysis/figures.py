"""The paper figures, one function each: `(paper, out) → written paths | Skipped(reason)`; `FIGURES` names them.

Bars start at zero; error bars are the sample sd over seeds with n stated; every figure writes the
numbers it draws as CSV beside it (analysis/paper_data.py).
"""

from __future__ import annotations

from pathlib import Path

from analysis.paper_data import Paper, Skipped, figure_files, seeds_note, table_files
from lab.report.atomic import write_text_atomic
from lab.report.conflict_figure import CSV_HEADER as CONFLICT_CSV_HEADER, conflict_figure, conflict_panels, draw
from lab.report.gradient_conflict import gradient_conflict_findings
from lab.report.plotting import figure, padded_range, series_style, short
from lab.report.records import finite
from lab.report.sweep_figures import (draw_final_loss_dots, draw_val_loss_over_training, mean_curve, mean_sd_curve, seeds_phrase,
                                      zero_based_ylim)
from lab.report.table import Variant

MiB = 1024 * 1024
LABEL_WIDTH = 22  # tick and legend labels wrap at this many characters (never cut)


def horizons(variant: Variant) -> range:
    return range(1, variant.max_k + 1)


def mean_sd(variant: Variant, metric: str) -> tuple[float | None, float | None, int]:
    return variant.stat(metric)


def formatted(variant: Variant, metric: str, digits: int = 3) -> str:
    return variant.cell(metric, digits)


def bar_panel(ax, paper: Paper, rows: list[Variant], values: list[tuple[float, float, int]], ylabel: str) -> None:
    """Bars from zero, one per variant in its colour, sd error bars where n > 1, each value written on its bar."""
    for i, (variant, (mean, sd, n)) in enumerate(zip(rows, values)):
        ax.bar(i, mean, yerr=sd if n > 1 else None, capsize=3, color=paper.colour(variant))
        ax.annotate(f"{mean:.3g}", (i, mean + (sd or 0)), ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax.set_ylim(*zero_based_ylim(max(m + (s or 0) for m, s, _ in values)))
    ax.set_xticks(range(len(rows)), [short(v.label, LABEL_WIDTH) for v in rows], rotation=30, ha="right")
    ax.set_ylabel(ylabel)


# ---- tables ---------------------------------------------------------------------------------------------------------


def table_s4_architectures(paper: Paper, out: Path):
    """Per-horizon validation loss (nats) and bits per byte of each variant (cf. Gloeckle et al. Table S4)."""
    rows = [v for v in paper.variants if v.stat("val/loss")[0] is not None]
    if not rows:
        return Skipped("no variant logged val/loss")
    max_k = max(v.max_k for v in rows)
    header = ["variant", "head", "K", "n", "val bpb", *[f"loss h{k}" for k in range(1, max_k + 1)]]
    cells = [[v.label, str(v.head), str(v.k), str(len(v.ok)), formatted(v, "val/bpb"), *[formatted(v, f"val/loss/h{k}") for k in range(1, max_k + 1)]]
             for v in rows]
    metrics = ["val/bpb", *[f"val/loss/h{k}" for k in range(1, max_k + 1)]]
    data_header = ["variant", "head", "K", "n", *[f"{m}{part}" for m in metrics for part in (" mean", " sd")]]
    data = [[v.label, v.head, v.k, len(v.ok), *[x for m in metrics for x in mean_sd(v, m)[:2]]] for v in rows]
    return table_files(out, "table_s4_architectures", "Validation loss per horizon (cf. Gloeckle et al. Table S4)", header, cells,
                       (data_header, data))


def train_speed(variant: Variant, contended: bool) -> float | None:
    """Tokens per second of training: per CPU-second of the worker thread when the sweep was contended."""
    return variant.cost("train_tokens_per_cpu_s" if contended else "train_tokens_per_s")


def table_s5_step_time(paper: Paper, out: Path):
    """Relative training step time, baseline ÷ variant throughput (cf. Gloeckle et al. Table S5): from CPU time when any job was
    contended (a wall-clock ranking then measures the machine's load), refused when a contended job has no CPU time."""
    rows = [v for v in paper.variants if v.cost("train_tokens_per_s")]
    if len(rows) < 2:
        return Skipped("fewer than 2 variants with a measured training throughput (run.json cost)")
    contended = any(r.get("cost", {}).get("train_contended") for v in rows for r in v.ok)
    speeds = [(v, train_speed(v, contended)) for v in rows]
    if any(speed is None for _, speed in speeds):
        return Skipped("jobs were contended (run.json cost.train_contended) and some have no CPU-time throughput: "
                       "a wall-clock step time would rank the machine's load")
    reference = paper.baseline if paper.baseline in rows else max(speeds, key=lambda item: item[1])[0]
    base = train_speed(reference, contended)
    clock = "worker CPU time (contended)" if contended else "wall clock"
    ratios = [(v, base / s) for v, s in speeds]
    with figure(max(5.0, 0.8 * len(rows) + 2), 3.8) as (fig, axes):
        ax = axes[0][0]
        bar_panel(ax, paper, rows, [(r, None, 1) for _, r in ratios], f"step time ÷ {short(reference.label, 30)}")
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_title(f"Relative training step time ({clock}; cf. Gloeckle et al. Table S5)")
        header = ["variant", "tokens per second", "clock", f"step time relative to {reference.label}"]
        data = [[v.label, s, clock, base / s] for v, s in speeds]
        written = figure_files(fig, out, "table_s5_step_time", header, data)
    cells = [[v.label, f"{s:,.0f}", clock, f"{base / s:.2f}"] for v, s in speeds]
    return written + table_files(out, "table_s5_step_time", "Relative step time (cf. Gloeckle et al. Table S5)", header, cells)


# ---- memory, accuracy, λ ----------------------------------------------------------------------------------------------


def memory_points(paper: Paper) -> list[tuple[Variant, str, int, float, float]]:
    """(variant, schedule, K, median saved-tensor peak, median live logits) in bytes over the jobs' logged steps."""
    from lab.report.sweep_figures import history_median

    points = []
    for v in paper.variants:
        saved, live = history_median(v.ok, "mem/saved_peak_bytes"), history_median(v.ok, "mem/logits_live_bytes")
        if saved is not None or live is not None:
            points.append((v, str(v.first.get("schedule")), int(v.k or 1), saved or 0.0, live or 0.0))
    return points


def byte_unit(largest: float) -> tuple[str, float]:
    return ("MiB", MiB) if largest >= MiB else ("KiB", 1024.0)


def fig2_memory(paper: Paper, out: Path):
    """Saved-tensor peak and live logits per variant with its backward schedule and K, bars from zero (cf. Gloeckle et al. Fig. 2)."""
    points = memory_points(paper)
    if len(points) < 2:
        return Skipped(f"{len(points)} variant(s) with memory metrics: nothing to compare (sweep schedule= or head.k=)")
    with figure(max(8.0, 1.6 * len(points) + 2), 4.2, 1, 2) as (fig, axes):
        for col, title in enumerate(("saved-tensor peak, measured", "live logits, logical")):
            ax = axes[0][col]
            unit, scale = byte_unit(max(p[3 + col] for p in points))
            values = [p[3 + col] / scale for p in points]
            ax.bar(range(len(points)), values, color=[paper.colour(p[0]) for p in points])
            for i, value in enumerate(values):
                ax.annotate(f"{value:.3g}", (i, value), ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
            ax.set_ylim(*zero_based_ylim(max(values)))
            ax.set_xticks(range(len(points)), [short(f"{v.label} [{s}, K={k}]", LABEL_WIDTH) for v, s, k, _, _ in points], rotation=30, ha="right")
            ax.set_ylabel(f"{title} ({unit})")
        fig.suptitle("Memory by backward schedule and K (cf. Gloeckle et al. Fig. 2); median over logged steps")
        data = [[v.label, s, k, saved, live] for v, s, k, saved, live in points]
        return figure_files(fig, out, "fig2_memory", ["variant", "schedule", "K", "saved_peak_bytes", "logits_live_bytes"], data)


ACCURACY_GROUPS = ((False, "blind heads: horizon k predicts t+k from t"),
                   (True, "teacher-forced (DeepSeek depths: true tokens up to t+k−1)"))


def medusa_head_accuracy(paper: Paper, out: Path):
    """Top-1 validation accuracy of each horizon's head against the horizon (cf. Medusa), sd over seeds. Teacher-forced
    heads (head trait `teacher_forced`: DeepSeek's depths saw the true earlier tokens) answer an easier question than
    blind heads, so they get their own panel; each panel's y-range is padded around its own data, not 0–1."""
    rows = [v for v in paper.variants if v.max_k > 1 and v.stat("val/acc/h1")[0] is not None]
    if not rows:
        return Skipped("no multi-horizon variant logged val/acc/h{k}")
    groups = [(title, [v for v in rows if v.teacher_forced == forced]) for forced, title in ACCURACY_GROUPS]
    groups = [(title, members) for title, members in groups if members]
    data = []
    with figure(5.2 * len(groups) + 2.2, 4.0, 1, len(groups)) as (fig, axes):
        for col, (title, members) in enumerate(groups):
            ax = axes[0][col]
            shown = []
            for v in members:
                ks = [k for k in horizons(v) if v.stat(f"val/acc/h{k}")[0] is not None]
                stats = [v.stat(f"val/acc/h{k}") for k in ks]
                colour, style = paper.styles[v.label]
                ax.errorbar(ks, [m for m, _, _ in stats], yerr=[s or 0 for _, s, _ in stats], marker="o", markersize=3, capsize=2,
                            color=colour, linestyle=style, label=short(v.label, LABEL_WIDTH))
                shown += [m + sign * (s or 0) for m, s, _ in stats for sign in (-1, 1)]
                data += [[v.label, "teacher-forced" if v.teacher_forced else "blind", k, m, s, n] for k, (m, s, n) in zip(ks, stats)]
            limits = padded_range(shown, pad=0.12, minimum_span=0.02)
            ax.set_ylim(max(limits[0], 0.0), min(limits[1], 1.0))
            ax.set_xlabel("horizon k")
            ax.set_ylabel("top-1 accuracy (validation)")
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.set_title(title, fontsize=8)
            ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.suptitle(f"Per-horizon accuracy (cf. Medusa); {seeds_note(rows, 'val/acc/h1')}")
        return figure_files(fig, out, "medusa_head_accuracy", ["variant", "heads", "horizon", "acc mean", "acc sd", "n"], data)


def deepseek_lambda_effect(paper: Paper, out: Path):
    """Teacher-forced chains (DeepSeek): λ of the extra depths over training and the next-token loss, when λ varies at all."""
    rows = [v for v in paper.variants if v.teacher_forced]
    if not rows:
        return Skipped("no teacher-forced chain (DeepSeek) variant")
    curves = {v.label: mean_curve(v.ok, "train/lambda/h2") for v in rows}
    values = {round(float(x), 12) for steps, lam in curves.values() for x in lam}
    if len(values) < 2:
        return Skipped(f"λ is constant ({', '.join(f'{x:g}' for x in sorted(values)) or 'not logged'}) in every chain run: nothing to show")
    data = [[v.label, int(s), float(x)] for v in rows for s, x in zip(*curves[v.label])]
    with figure(10.0, 3.8, 1, 2) as (fig, axes):
        left, right = axes[0]
        for v in rows:
            left.plot(*curves[v.label], color=paper.colour(v), label=short(v.label, LABEL_WIDTH))
        left.set_xlabel("step")
        left.set_ylabel("λ (extra depths)")
        left.set_ylim(bottom=0)
        left.legend()
        scored = [v for v in rows if v.stat("val/loss")[0] is not None]
        if scored:
            bar_panel(right, paper, scored, [v.stat("val/loss") for v in scored], "val next-token loss (nats)")
            right.set_title(seeds_note(scored, "val/loss"))
        fig.suptitle("DeepSeek λ schedule and the next-token loss")
        return figure_files(fig, out, "deepseek_lambda_effect", ["variant", "step", "lambda_h2"], data)


# ---- the ablation's own figures ----------------------------------------------------------------------------------------


def reduction_weights(paper: Paper, out: Path):
    """The reduction × λ-schedule comparison: next-token validation loss (bars from zero, each seed a dot) and per-horizon
    validation loss (one line per variant, each seed's value a dot)."""
    combos = {(v.first.get("reduction"), v.first.get("weights")) for v in paper.variants}
    if len(combos) < 2:
        return Skipped(f"one reduction policy and λ schedule in this sweep ({', '.join(map(str, next(iter(combos))))}): "
                       "sweep reduction= and/or weights=")
    rows = [v for v in paper.variants if v.stat("val/loss")[0] is not None]
    data = []
    with figure(12.0, 4.4, 1, 2) as (fig, axes):
        left, right = axes[0]
        bar_panel(left, paper, rows, [v.stat("val/loss") for v in rows], "val next-token loss (nats)")
        for i, v in enumerate(rows):
            seeds = v.values("val/loss")
            left.scatter([i] * len(seeds), seeds, s=10, color="black", zorder=3)
        left.set_title(f"next-token loss; {seeds_note(rows, 'val/loss')}, dots = seeds")
        for v in rows:
            ks = [k for k in horizons(v) if v.stat(f"val/loss/h{k}")[0] is not None]
            right.plot(ks, [v.stat(f"val/loss/h{k}")[0] for k in ks], marker="o", markersize=3, color=paper.colour(v),
                       label=short(v.label, LABEL_WIDTH))
            for r in v.ok:
                per_seed = [(k, r["final"].get(f"val/loss/h{k}")) for k in ks]
                right.scatter([k for k, x in per_seed if finite(x)], [x for _, x in per_seed if finite(x)], s=8, color=paper.colour(v))
                data += [[v.label, v.first.get("reduction"), v.first.get("weights"), r.get("seed"), k, x] for k, x in per_seed]
        right.set_xlabel("horizon k")
        right.set_ylabel("val loss (nats)")
        right.xaxis.get_major_locator().set_params(integer=True)
        right.set_title("per-horizon validation loss (lines: mean; dots: seeds)")
        right.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.suptitle("Reduction policy × λ schedule")
        return figure_files(fig, out, "reduction_weights", ["variant", "reduction", "weights", "seed", "horizon", "val_loss"], data)


def grad_cosine_over_training(paper: Paper, out: Path):
    """Gradient cosine between horizons over training: one column per variant (policy against policy), one row per
    space (trunk output, then parameter groups; tied embed/unembed once), line = mean over seeds, band = ± sd;
    the gradient-conflict findings the report prints go beside it as grad_cosine_over_training.md."""
    panels = conflict_panels(paper.variants)
    if not any(len(s.steps) > 1 for _, series in panels for s in series):
        return Skipped("no gradient cosine logged at two or more steps (the diagnostics callbacks: callbacks=diagnostics)")
    with conflict_figure(panels) as (fig, axes):
        data = draw(fig, axes, panels)
        written = figure_files(fig, out, "grad_cosine_over_training", CONFLICT_CSV_HEADER, data)
    findings = gradient_conflict_findings(paper.variants)
    return written + [write_text_atomic(out / "grad_cosine_over_training.md", "".join(f"- {line}\n" for line in findings))]


def horizon_accuracy_over_training(paper: Paper, out: Path):
    """Per-horizon validation accuracy and draft agreement at every validation (the optimizer step it ran at), one
    panel pair per variant: horizons in greys with their own line style and marker (variant colours mean variants),
    line = mean over seeds, band = ± sd, n in each panel's title."""
    series = []
    for v in [v for v in paper.variants if v.max_k > 1]:
        acc = [(k, *mean_sd_curve(v.ok, f"val/acc/h{k}")) for k in horizons(v)]
        agree = [(k, *mean_sd_curve(v.ok, f"val/agree/h{k}")) for k in range(2, v.max_k + 1)]
        if any(len(steps) > 1 for _, steps, *_ in acc):
            series.append((v, acc, agree))
    if not series:
        return Skipped("fewer than two validations of a multi-horizon variant (trainer.val_check_interval)")
    data = []
    with figure(10.5, 2.9 * len(series) + 0.8, len(series), 2) as (fig, axes):
        for row, (v, acc, agree) in enumerate(series):
            for col, (curves, what) in enumerate(((acc, "val/acc"), (agree, "val/agree"))):
                ax = axes[row][col]
                shown = []
                for k, steps, means, sds, n in curves:
                    if not len(steps):
                        continue
                    style = series_style(k - 1)
                    ax.plot(steps, means, markersize=3, label=f"h{k}", **style)
                    if n > 1:
                        ax.fill_between(steps, means - sds, means + sds, color=style["color"], alpha=0.15, linewidth=0)
                    shown += list(means - sds) + list(means + sds)
                    data += [[v.label, what, k, int(s), float(x), float(sd), n] for s, x, sd in zip(steps, means, sds)]
                limits = padded_range(shown, pad=0.1, minimum_span=0.02)
                if limits is not None:
                    ax.set_ylim(max(limits[0], 0.0), min(limits[1], 1.0))
                ax.set_xticks(sorted({int(s) for _, steps, *_ in curves for s in steps}))
                ax.set_title(short(f"{v.label}: {what} ({seeds_phrase([len(v.ok)])})", 56), fontsize=8, color=paper.colour(v))
                ax.set_xlabel("optimizer step (validation)")
                if ax.lines:
                    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.suptitle("Per-horizon accuracy and draft agreement over training (line: mean, band: ± sd over seeds)")
        return figure_files(fig, out, "horizon_accuracy_over_training",
                            ["variant", "metric", "horizon", "step", "mean", "sd", "n"], data)


def quality_vs_cost(paper: Paper, out: Path):
    """Validation next-token loss against training FLOPs per token and against training CPU seconds, a point per variant."""
    axes_of = (("train_flops_per_token", "training FLOPs per token (M)", 1e-6), ("train_process_cpu_s", "training CPU time (s)", 1.0))
    rows = [v for v in paper.variants if v.stat("val/loss")[0] is not None and any(v.cost(name) for name, _, _ in axes_of)]
    if len(rows) < 2:
        return Skipped("fewer than 2 variants with val/loss and a cost (run.json cost)")
    data = [[v.label, *v.stat("val/loss"), *[v.cost(name) for name, _, _ in axes_of]] for v in rows]
    with figure(11.0, 4.0, 1, 2) as (fig, axes):
        for col, (name, label, scale) in enumerate(axes_of):
            ax = axes[0][col]
            for v in rows:
                x, (mean, sd, n) = v.cost(name), v.stat("val/loss")
                if x:
                    ax.errorbar([x * scale], [mean], yerr=[sd] if n > 1 else None, marker="o", capsize=3, color=paper.colour(v),
                                label=short(v.label, LABEL_WIDTH))
            ax.set_xlabel(label)
            ax.set_ylabel("val next-token loss (nats)")
            xs = [v.cost(name) * scale for v in rows if v.cost(name)]
            if xs:  # the points' own range, padded: from zero every point sat in the right fifth
                ax.set_xlim(*padded_range(xs, pad=0.12, minimum_span=0.05 * max(xs)))
            ys = [m + sign * (sd or 0) for v in rows for m, sd, _ in [v.stat("val/loss")] for sign in (-1, 1)]
            ax.set_ylim(*padded_range(ys, pad=0.12))
            if not ax.lines:
                ax.text(0.5, 0.5, f"{name}: not recorded", transform=ax.transAxes, ha="center")
        legend_axis = axes[0][1] if axes[0][1].lines else axes[0][0]
        legend_axis.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.suptitle(f"Quality against cost ({seeds_note(rows, 'val/loss')})")
        header = ["variant", "val_loss mean", "val_loss sd", "n", *[name for name, _, _ in axes_of]]
        return figure_files(fig, out, "quality_vs_cost", header, data)


def val_loss_over_training(paper: Paper, out: Path):
    """Validation next-token loss at every validation: mean over seeds, band ± sd, n in the legend."""
    rows = [v for v in paper.variants if len(mean_sd_curve(v.ok, "val/loss")[0]) > 1]
    if not rows:
        return Skipped("fewer than two validations logged (trainer.val_check_interval)")
    with figure(8.5, 4.2) as (fig, axes):
        ax = axes[0][0]
        data = draw_val_loss_over_training(ax, rows, paper.styles, paper.baseline)
        ax.set_title(f"Validation next-token loss over training\n(line: mean, band: ± sd over seeds; {seeds_phrase([len(v.ok) for v in rows])})")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return figure_files(fig, out, "val_loss_over_training", ["variant", "step", "mean", "sd", "n"], data)


def final_loss_dots(paper: Paper, out: Path):
    """Final validation loss per variant, best first: every seed a dot, the mean a bar, the baseline's mean dashed."""
    rows = [v for v in paper.variants if v.stat("val/loss")[0] is not None]
    if len(rows) < 2:
        return Skipped(f"{len(rows)} variant(s) with val/loss: nothing to compare")
    with figure(7.5, max(2.4, 0.55 * len(rows) + 1.3)) as (fig, axes):
        ax = axes[0][0]
        data = draw_final_loss_dots(ax, rows, paper.styles, paper.baseline)
        chosen = paper.baseline
        note = "dots: seeds, bar: mean" + ("" if chosen is None else f", dashed: baseline {short(chosen.label, 24)}")
        ax.set_title(f"Final validation loss per variant ({note})", fontsize=8)
        return figure_files(fig, out, "final_loss_dots", ["variant", "seed", "val_loss", "mean", "sd", "n", "baseline"], data)


FIGURES = {function.__name__: function for function in (
    table_s4_architectures, table_s5_step_time, fig2_memory, medusa_head_accuracy, deepseek_lambda_effect,
    reduction_weights, grad_cosine_over_training, horizon_accuracy_over_training, quality_vs_cost,
    val_loss_over_training, final_loss_dots,
)}


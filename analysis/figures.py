"""The paper figures, one function each: `(paper, out) → written paths | Skipped(reason)`; `FIGURES` names them.

Bars start at zero; error bars are the sample sd over seeds with n stated; every figure writes the
numbers it draws as CSV beside it (analysis/paper_data.py).
"""

from __future__ import annotations

from pathlib import Path

from analysis.paper_data import Paper, Skipped, figure_files, seeds_note, table_files
from lab.report.plotting import color, figure, short
from lab.report.records import finite
from lab.report.sweep_figures import GRAD_COS, mean_curve, zero_based_ylim
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


def medusa_head_accuracy(paper: Paper, out: Path):
    """Top-1 validation accuracy of each horizon's head against the horizon (cf. Medusa), sd over seeds."""
    rows = [v for v in paper.variants if v.max_k > 1 and v.stat("val/acc/h1")[0] is not None]
    if not rows:
        return Skipped("no multi-horizon variant logged val/acc/h{k}")
    data = []
    with figure(7.5, 4.0) as (fig, axes):
        ax = axes[0][0]
        for v in rows:
            ks = [k for k in horizons(v) if v.stat(f"val/acc/h{k}")[0] is not None]
            stats = [v.stat(f"val/acc/h{k}") for k in ks]
            ax.errorbar(ks, [m for m, _, _ in stats], yerr=[s or 0 for _, s, _ in stats], marker="o", markersize=3, capsize=2,
                        color=paper.colour(v), label=short(v.label, LABEL_WIDTH) + (" (teacher-forced)" if v.teacher_forced else ""))
            data += [[v.label, k, m, s, n] for k, (m, s, n) in zip(ks, stats)]
        ax.set_xlabel("horizon k")
        ax.set_ylabel("top-1 accuracy (validation)")
        ax.set_ylim(0, 1)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"Per-horizon accuracy (cf. Medusa); {seeds_note(rows, 'val/acc/h1')}")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return figure_files(fig, out, "medusa_head_accuracy", ["variant", "horizon", "acc mean", "acc sd", "n"], data)


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


def grid_of(n: int, per_panel: tuple[float, float]):
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    return figure(per_panel[0] * cols + 2.5, per_panel[1] * rows + 0.6, rows, cols)


def grad_cosine_over_training(paper: Paper, out: Path):
    """Gradient cosine between horizons over training: one panel per variant and parameter group, one line per pair."""
    panels = []
    for v in paper.variants:
        names = sorted({name for r in v.ok for name in r["history"] if GRAD_COS.match(name)})
        for space in sorted({GRAD_COS.match(n).group("space") or "trunk output" for n in names}):
            pairs = [n for n in names if (GRAD_COS.match(n).group("space") or "trunk output") == space]
            curves = [(n, *mean_curve(v.ok, n)) for n in pairs]
            if any(len(steps) > 1 for _, steps, _ in curves):
                panels.append((v, space, curves))
    if not panels:
        return Skipped("no gradient cosine logged at two or more steps (the diagnostics callbacks: callbacks=diagnostics)")
    data = []
    with grid_of(len(panels), (4.0, 3.0)) as (fig, axes):
        for index, (v, space, curves) in enumerate(panels):
            ax = axes[index // axes.shape[1]][index % axes.shape[1]]
            for i, (name, steps, values) in enumerate(curves):
                match = GRAD_COS.match(name)
                ax.plot(steps, values, color=color(i), label=f"h{match.group('i')}–h{match.group('j')}")
                data += [[v.label, space, f"h{match.group('i')}_h{match.group('j')}", int(s), float(x)] for s, x in zip(steps, values)]
            ax.axhline(0, color="black", linewidth=0.6)
            ax.set_ylim(-1, 1)
            ax.set_title(short(f"{v.label} — {space}", 40), fontsize=8)
            ax.set_xlabel("step")
            ax.legend(fontsize=6, ncol=2)
        for index in range(len(panels), axes.size):
            axes[index // axes.shape[1]][index % axes.shape[1]].axis("off")
        fig.suptitle("Gradient cosine between horizons over training (mean over seeds)", y=1.01)  # above the panel titles
        return figure_files(fig, out, "grad_cosine_over_training", ["variant", "parameter group", "pair", "step", "cosine"], data)


def horizon_accuracy_over_training(paper: Paper, out: Path):
    """Per-horizon validation accuracy and draft agreement at every validation, one panel pair per variant."""
    series = []
    for v in [v for v in paper.variants if v.max_k > 1]:
        acc = [(k, *mean_curve(v.ok, f"val/acc/h{k}")) for k in horizons(v)]
        agree = [(k, *mean_curve(v.ok, f"val/agree/h{k}")) for k in range(2, v.max_k + 1)]
        if any(len(steps) > 1 for _, steps, _ in acc):
            series.append((v, acc, agree))
    if not series:
        return Skipped("fewer than two validations of a multi-horizon variant (trainer.val_check_interval)")
    data = []
    with figure(10.0, 2.8 * len(series) + 0.6, len(series), 2) as (fig, axes):
        for row, (v, acc, agree) in enumerate(series):
            for col, (curves, what) in enumerate(((acc, "val/acc"), (agree, "val/agree"))):
                ax = axes[row][col]
                for k, steps, values in curves:
                    ax.plot(steps, values, marker="o", markersize=3, color=color(k - 1), label=f"h{k}")
                    data += [[v.label, what, k, int(s), float(x)] for s, x in zip(steps, values)]
                ax.set_ylim(0, 1)
                ax.set_title(short(f"{v.label}: {what}", 48), fontsize=8)
                ax.set_xlabel("step")
                ax.legend(fontsize=6, ncol=2)
        fig.suptitle("Per-horizon accuracy and draft agreement over training (mean over seeds)", y=1.01)
        return figure_files(fig, out, "horizon_accuracy_over_training", ["variant", "metric", "horizon", "step", "value"], data)


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
            ax.set_xlim(0, 1.1 * max(xs) if xs else 1)  # from zero, every point inside
            if not ax.lines:
                ax.text(0.5, 0.5, f"{name}: not recorded", transform=ax.transAxes, ha="center")
        legend_axis = axes[0][1] if axes[0][1].lines else axes[0][0]
        legend_axis.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.suptitle(f"Quality against cost ({seeds_note(rows, 'val/loss')})")
        header = ["variant", "val_loss mean", "val_loss sd", "n", *[name for name, _, _ in axes_of]]
        return figure_files(fig, out, "quality_vs_cost", header, data)


FIGURES = {function.__name__: function for function in (
    table_s4_architectures, table_s5_step_time, fig2_memory, medusa_head_accuracy, deepseek_lambda_effect,
    reduction_weights, grad_cosine_over_training, horizon_accuracy_over_training, quality_vs_cost,
)}


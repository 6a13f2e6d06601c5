"""Paper figures from stored run data (no retraining): `python -m analysis.paper_figures SWEEP_DIR --out DIR`.

One function per figure; each takes the collected sweep and an output directory, writes
its PNG (tables also as Markdown) and returns the written paths, or [] when the sweep has
no data for it. Same data → byte-identical files (lab.report.plotting).

Small-scale analogues of:
- Gloeckle et al. Table S4: architecture comparison (per-horizon validation loss)
- Gloeckle et al. Table S5: relative step time of each architecture vs next-token prediction
- Gloeckle et al. Fig. 2: memory of sequential vs joint backward (saved-tensor peak, logits)
- Medusa: top-1 accuracy of each head vs its horizon
- DeepSeek-V3: the λ schedule and its effect on next-token loss
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

from lab.report.sweep_figures import history_median, mean_curve, order_key
from lab.report.plotting import color, figure, save_png, short
from lab.report.records import ReportError, Sweep, collect_sweep, finite
from lab.report.table import Variant, variants

MiB = 1024 * 1024


def write_md(path: Path, header: list[str], rows: list[list[str]], title: str) -> Path:
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def table_png(path: Path, header: list[str], rows: list[list[str]], title: str) -> Path:
    with figure(min(16.0, 1.2 + 1.05 * len(header)), 0.9 + 0.32 * (len(rows) + 1)) as (fig, axes):
        ax = axes[0][0]
        ax.axis("off")
        table = ax.table(cellText=rows, colLabels=header, loc="center", cellLoc="center")
        table.auto_set_font_size(False)
        table.set_fontsize(7)
        table.scale(1.0, 1.25)
        ax.set_title(title, fontsize=9)
        return save_png(fig, path)


def completed_variants(sweep: Sweep) -> list[Variant]:
    return [v for v in sorted(variants(sweep.records), key=order_key) if v.ok]


def table_s4_architectures(sweep: Sweep, out: Path) -> list[Path]:
    """Per-horizon validation loss (nats) and bits per byte of each architecture / K."""
    rows_v = [v for v in completed_variants(sweep) if v.stat("val/loss")[0] is not None]
    if not rows_v:
        return []
    max_k = max(v.max_k for v in rows_v)
    header = ["variant", "head", "K", "n", "val bpb", *[f"loss h{k}" for k in range(1, max_k + 1)]]
    rows = [[short(v.label, 32), str(v.head), str(v.k), str(len(v.ok)), v.cell("val/bpb", 3),
             *[v.cell(f"val/loss/h{k}", 3) for k in range(1, max_k + 1)]] for v in rows_v]
    title = "Architecture comparison (cf. Gloeckle et al. Table S4): validation loss per horizon"
    return [table_png(out / "table_s4_architectures.png", header, rows, title),
            write_md(out / "table_s4_architectures.md", header, rows, title)]


def table_s5_step_time(sweep: Sweep, out: Path) -> list[Path]:
    """Relative training step time (median tokens/s of ntp ÷ that of the variant; 1.0 = as fast as ntp)."""
    speeds = [(v, history_median(v.ok, "train/tokens_per_s")) for v in completed_variants(sweep)]
    speeds = [(v, s) for v, s in speeds if s]
    if not speeds:
        return []
    base = next((s for v, s in speeds if v.is_baseline), None)
    reference = "ntp" if base else "the fastest variant"
    base = base or max(s for _, s in speeds)
    header = ["variant", "head", "K", "tokens/s (median)", f"step time relative to {reference}"]
    rows = [[short(v.label, 32), str(v.head), str(v.k), f"{s:,.0f}", f"{base / s:.2f}"] for v, s in speeds]
    with figure(max(5.0, 0.7 * len(speeds) + 2), 3.6) as (fig, axes):
        ax = axes[0][0]
        ax.bar(range(len(speeds)), [base / s for _, s in speeds], color=[color(i) for i in range(len(speeds))])
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_xticks(range(len(speeds)), [short(v.label) for v, _ in speeds], rotation=30, ha="right")
        ax.set_ylabel(f"step time / {reference}")
        ax.set_title("Relative step time (cf. Gloeckle et al. Table S5)")
        png = save_png(fig, out / "table_s5_step_time.png")
    return [png, write_md(out / "table_s5_step_time.md", header, rows, "Relative step time (cf. Gloeckle et al. Table S5)")]


def fig2_memory(sweep: Sweep, out: Path) -> list[Path]:
    """Saved-tensor peak and logical live logits per backward schedule, against K (lines per schedule)."""
    points: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for record in sweep.completed:
        saved = history_median([record], "mem/saved_peak_bytes")
        live = history_median([record], "mem/logits_live_bytes")
        if saved is None and live is None:
            continue
        points.setdefault(str(record.get("schedule")), {}).setdefault(int(record.get("k") or 1), []).append((saved or 0.0, live or 0.0))
    if not points:
        return []
    with figure(9.0, 3.6, 1, 2) as (fig, axes):
        for col, (index, label) in enumerate(((0, "saved-tensor peak, measured (MiB)"), (1, "live logits, logical (MiB)"))):
            ax = axes[0][col]
            for i, schedule in enumerate(sorted(points)):
                ks = sorted(points[schedule])
                ax.plot(ks, [statistics.fmean(p[index] for p in points[schedule][k]) / MiB for k in ks],
                        marker="o", markersize=4, color=color(i), label=schedule)
            ax.set_xlabel("K (horizons)")
            ax.set_ylabel(label)
            ax.xaxis.get_major_locator().set_params(integer=True)
        axes[0][0].legend(title="schedule")
        fig.suptitle("Memory of sequential vs joint backward (cf. Gloeckle et al. Fig. 2)")
        return [save_png(fig, out / "fig2_memory.png")]


def medusa_head_accuracy(sweep: Sweep, out: Path) -> list[Path]:
    """Top-1 validation accuracy of each horizon's head vs the horizon (one line per variant)."""
    rows = [v for v in completed_variants(sweep) if v.max_k > 1 and v.stat("val/acc/h1")[0] is not None]
    if not rows:
        return []
    with figure(6.0, 4.0) as (fig, axes):
        ax = axes[0][0]
        for i, v in enumerate(rows):
            ks = [k for k in range(1, v.max_k + 1) if v.stat(f"val/acc/h{k}")[0] is not None]
            ax.errorbar(ks, [v.stat(f"val/acc/h{k}")[0] for k in ks], yerr=[v.stat(f"val/acc/h{k}")[1] or 0 for k in ks],
                        marker="o", markersize=3, capsize=2, color=color(i), label=short(v.label))
        ax.set_xlabel("head / horizon k")
        ax.set_ylabel("top-1 accuracy (validation)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title("Per-head accuracy (cf. Medusa)")
        ax.legend()
        return [save_png(fig, out / "medusa_head_accuracy.png")]


def deepseek_lambda_effect(sweep: Sweep, out: Path) -> list[Path]:
    """Chain-head runs (teacher-forced depths, i.e. DeepSeek): λ of the extra depths over training (left) and the next-token loss (right)."""
    rows = [v for v in completed_variants(sweep) if v.teacher_forced]
    if not rows:
        return []
    with figure(10.0, 3.8, 1, 2) as (fig, axes):
        left, right = axes[0]
        for i, v in enumerate(rows):
            steps, values = mean_curve(v.ok, "train/lambda/h2")
            if len(steps):
                left.plot(steps, values, color=color(i), label=short(v.label))
            mean, spread, n = v.stat("val/loss")
            if finite(mean):
                right.bar(i, mean, yerr=spread if n > 1 else None, capsize=3, color=color(i))
        left.set_xlabel("step")
        left.set_ylabel("λ (extra depths)")
        left.set_title("λ schedule")
        left.legend()
        right.set_xticks(range(len(rows)), [short(v.label) for v in rows], rotation=30, ha="right")
        right.set_ylabel("val next-token loss (nats)")
        values = [v.stat("val/loss")[0] for v in rows if finite(v.stat("val/loss")[0])]
        if values:
            right.set_ylim(min(values) - 0.05 - 0.2 * (max(values) - min(values)), max(values) + 0.05 + 0.2 * (max(values) - min(values)))
        right.set_title("next-token loss")
        fig.suptitle("DeepSeek λ schedule and its effect")
        return [save_png(fig, out / "deepseek_lambda_effect.png")]


FIGURES = (table_s4_architectures, table_s5_step_time, fig2_memory, medusa_head_accuracy, deepseek_lambda_effect)


def regenerate(sweep_dir: str | Path, out: str | Path) -> dict[str, list[Path]]:
    sweep = collect_sweep(sweep_dir)
    if not sweep.completed:
        raise ReportError(f"{sweep_dir}: no completed runs ({len(sweep.records)} jobs)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    np.random.seed(0)  # nothing here is random; fixed anyway so a future jitter stays reproducible
    return {function.__name__: function(sweep, out) for function in FIGURES}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.paper_figures", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        written = regenerate(args.sweep_dir, args.out)
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    for name, paths in written.items():
        print(f"{name}: " + (", ".join(str(p) for p in paths) if paths else "skipped (no data for it in this sweep)"))


if __name__ == "__main__":
    main()

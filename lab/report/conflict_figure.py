"""The gradient-conflict figure the sweep report (grad_cosine.png) and the paper figures
(grad_cosine_over_training) both draw: the cosine between horizons' gradients over training.

One column per variant (policy against policy, side by side, sharing the y-axis), one row per space
(the trunk output first, then each parameter group; tied groups once, as `embed = unembed (tied)`),
one line per horizon pair in the same colour in every panel; the line is the mean over seeds, the
band ± the sd over seeds. The series come from lab/report/gradient_conflict.py, which also writes
the findings that go with it.
"""

from __future__ import annotations

from lab.report.gradient_conflict import TRUNK_OUTPUT, PairSeries, conflict_series
from lab.report.plotting import figure, series_style, short

CSV_HEADER = ["variant", "parameter group", "pair", "step", "cosine", "sd over seeds", "seeds"]


def conflict_panels(variants) -> list[tuple[str, list[PairSeries]]]:
    """(variant label, its series) for every variant that logged a gradient cosine, in the given order."""
    return [(v.label, series) for v in variants if (series := conflict_series(v.ok))]


def spaces_of(panels) -> list[str]:
    spaces = {s.space for _, series in panels for s in series}
    return sorted(spaces, key=lambda space: (space != TRUNK_OUTPUT, space))


def pairs_of(panels) -> list[tuple[int, int]]:
    return sorted({s.pair for _, series in panels for s in series})


def conflict_figure(panels: list[tuple[str, list[PairSeries]]]):
    """`figure(...)` sized for len(spaces) rows × len(variants) columns."""
    return figure(3.2 * len(panels) + 1.2, 2.6 * len(spaces_of(panels)) + 0.8, len(spaces_of(panels)), len(panels), sharey=True)


def draw(fig, axes, panels: list[tuple[str, list[PairSeries]]]) -> list[list]:
    """Draw every panel; returns the CSV rows (CSV_HEADER) of the numbers drawn."""
    spaces, pairs = spaces_of(panels), pairs_of(panels)
    styles = {pair: series_style(index) for index, pair in enumerate(pairs)}  # greys: variant colours mean variants
    seeds = sorted({s.seeds for _, series in panels for s in series})
    data = []
    for col, (label, series) in enumerate(panels):
        for row, space in enumerate(spaces):
            ax = axes[row][col]
            shown = [s for s in series if s.space == space]
            ax.set_title(f"{short(label, 32)}\n{space}", fontsize=8)
            if not shown:
                ax.text(0.5, 0.5, "not logged", transform=ax.transAxes, ha="center", va="center", fontsize=8)
                continue
            for s in shown:
                style = styles[s.pair]
                ax.plot(s.steps, s.mean, color=style["color"], linestyle=style["linestyle"], marker=style["marker"], markersize=3,
                        markevery=max(1, len(s.steps) // 8), label=s.pair_label)
                if s.seeds > 1:
                    ax.fill_between(s.steps, s.mean - s.sd, s.mean + s.sd, color=style["color"], alpha=0.15, linewidth=0)
                data += [[label, space, f"h{s.pair[0]}_h{s.pair[1]}", int(step), float(m), float(sd), s.seeds]
                         for step, m, sd in zip(s.steps, s.mean, s.sd)]
            ax.axhline(0, color="black", linewidth=0.6)
            ax.set_ylim(-1, 1)
            ax.set_xlabel("step")
            if col == 0:
                ax.set_ylabel("cosine")
            if col == len(panels) - 1:
                ax.legend(fontsize=6, ncol=1 if len(shown) < 4 else 2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    spread = "one seed each (no band)" if max(seeds) < 2 else f"line: mean, band: ± sd over n = {'/'.join(map(str, seeds))} seeds"
    fig.suptitle(f"Gradient cosine between horizons over training ({spread})", y=1.01)
    return data

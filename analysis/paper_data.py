"""What a paper figure draws from: the sweep's completed variants (relabelled, in display order, one colour
each) and the writers every figure shares (PNG/PDF/SVG + CSV; tables as CSV, Markdown and LaTeX)."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from lab.report.atomic import write_text_atomic
from lab.report.labels import apply, for_figures, resolve
from lab.report.plotting import save_formats
from lab.report.records import Sweep
from lab.report.sweep_figures import order_key, variant_styles
from lab.report.table import Variant, baseline_of, variants


@dataclass(frozen=True)
class Skipped:
    """A figure this sweep cannot fill, and the one line saying why."""

    reason: str


@dataclass
class Paper:
    sweep: Sweep
    variants: list[Variant]  # completed, in display order, labels as the paper shows them
    styles: dict[str, tuple[str, str]]  # label → (colour, line style)

    @classmethod
    def of(cls, sweep: Sweep, labels: dict[str, str] | None = None, baseline: str | None = None,
           label_args: list[str] | None = None) -> "Paper":
        """`labels` {OLD: NEW} and `label_args` ['OLD=NEW', …] (OLD: a variant's report label or its readable form)
        rename variants; every other variant shows its readable label (lab/report/labels.py)."""
        groups = variants(sweep.records, baseline, field="--baseline")
        renamed = resolve(label_args or [], labels or {}, [v.label for v in groups])
        apply(groups, renamed)
        shown = for_figures(groups, keep=set(renamed.values()))
        completed = [v for v in sorted(shown, key=order_key) if v.ok]
        return cls(sweep, completed, variant_styles(shown))

    @property
    def baseline(self) -> Variant | None:
        return baseline_of(self.variants)

    def colour(self, variant: Variant) -> str:
        return self.styles[variant.label][0]


def csv_text(header: list[str], rows: list[list]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([["" if cell is None else cell for cell in row] for row in rows])
    return buffer.getvalue()


def figure_files(fig, out: Path, name: str, header: list[str], rows: list[list]) -> list[Path]:
    """name.png, name.pdf, name.svg and name.csv (the numbers the figure draws)."""
    return [*save_formats(fig, out / name), write_text_atomic(out / f"{name}.csv", csv_text(header, rows))]


def table_files(out: Path, name: str, title: str, header: list[str], rows: list[list[str]],
                data: tuple[list[str], list[list]] | None = None) -> list[Path]:
    """name.md and name.tex (formatted cells) and, given `data`, name.csv (numbers, mean and sd in their own columns)."""
    md = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header), *["| " + " | ".join(r) + " |" for r in rows]]
    tex = [f"% {title}", "\\begin{tabular}{l" + "r" * (len(header) - 1) + "}", "\\hline", " & ".join(map(latex, header)) + " \\\\",
           "\\hline", *[" & ".join(map(latex, r)) + " \\\\" for r in rows], "\\hline", "\\end{tabular}"]
    written = [write_text_atomic(out / f"{name}.csv", csv_text(*data))] if data is not None else []
    return written + [write_text_atomic(out / f"{name}.md", "\n".join(md) + "\n"), write_text_atomic(out / f"{name}.tex", "\n".join(tex) + "\n")]


LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                 "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$", "—": "--", "→": r"$\to$"}


def latex(cell: str) -> str:
    return "".join(LATEX_ESCAPES.get(char, char) for char in str(cell))


def seeds_note(variants: list[Variant], metric: str) -> str:
    """'mean ± sd over n = 3 seeds' (n as the variants have it), or 'one seed each'."""
    counts = sorted({v.stat(metric)[2] for v in variants if v.stat(metric)[2]})
    if not counts or max(counts) < 2:
        return "one seed each (no error bar)"
    return f"mean ± sd over n = {'/'.join(map(str, counts))} seeds"

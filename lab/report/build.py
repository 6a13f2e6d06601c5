"""Build the sweep report: runs.csv, history.csv, figures/*.png, report.md, report.html (idempotent)."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from lab.report.sweep_figures import write_report_figures
from lab.report.atomic import remove_stale_temps, write_text_atomic
from lab.report.labels import apply, for_figures, resolve
from lab.report.records import FIGURES_DIR, ReportError, Sweep, collect_sweep
from lab.report.render import findings, html_page, markdown
from lab.report.scaling import write_scaling_figures
from lab.report.table import history_csv_text, runs_csv_text, variants


@dataclass
class Report:
    out_dir: Path
    runs_csv: Path
    markdown: Path
    html: Path
    figures: list[Path]
    n_ok: int
    n_failed: int  # jobs whose run failed (an error, a refused first attempt)
    findings: list[str]
    n_other: dict[str, int] = field(default_factory=dict)  # neither ok nor failed: interrupted, running, not started

    @property
    def counts(self) -> str:
        """'3 ok, 1 failed, 1 interrupted, 1 not started': every job under its own status."""
        return ", ".join([f"{self.n_ok} ok", f"{self.n_failed} failed", *(f"{n} {status}" for status, n in self.n_other.items())])

    @property
    def n_not_ok(self) -> int:
        return self.n_failed + sum(self.n_other.values())


def build_report(sweep: Sweep, out_dir: str | Path, baseline: str | None = None, title: str | None = None,
                 labels: dict[str, str] | None = None, label_args: list[str] | None = None) -> Report:
    """Every output is a pure function of the records: rebuilding from the same data gives the same bytes.
    `baseline`: the variant label differences are taken to (`report.baseline`; None: ntp when the sweep has one).
    `title`: the page's title and heading (None: what the sweep varied, `render.default_title`).
    `labels` {OLD: NEW} / `label_args` ['OLD=NEW']: variants shown as NEW in every figure, table and finding
    (lab/report/labels.py); the figures show every other variant by its readable label (`parallel K=4`)."""
    if not sweep.records:
        raise ReportError(f"{sweep.source}: no completed runs (the sweep has no jobs)")
    if not sweep.completed:
        reasons = "; ".join(f"job {r['job']}: {r['error']}" for r in sweep.failed[:3])
        more = f" (+{len(sweep.failed) - 3} more)" if len(sweep.failed) > 3 else ""
        raise ReportError(f"{sweep.source}: no completed runs ({len(sweep.failed)} failed: {reasons}{more})")
    groups = variants(sweep.records, baseline)  # refuses an unknown baseline before anything is written
    renamed = resolve(label_args or [], labels or {}, [v.label for v in groups])  # likewise a label naming no variant
    apply(groups, renamed)
    shown = for_figures(groups, keep=set(renamed.values()))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for folder in (out, out / FIGURES_DIR):
        remove_stale_temps(folder)  # a killed lab-report's half-written files
    runs_csv = write_text_atomic(out / "runs.csv", runs_csv_text(sweep.records))
    write_text_atomic(out / "history.csv", history_csv_text(sweep.records))
    figures = write_report_figures(shown, out / FIGURES_DIR) + write_scaling_figures(groups, out / FIGURES_DIR)
    md = write_text_atomic(out / "report.md", markdown(sweep, groups, figures, FIGURES_DIR, title))
    page = write_text_atomic(out / "report.html", html_page(sweep, groups, figures, title))
    statuses = Counter(r["status"] for r in sweep.records)
    n_ok, n_failed = statuses.pop("ok", 0), statuses.pop("failed", 0)
    return Report(out, runs_csv, md, page, [f.path for f in figures if f.path is not None], n_ok, n_failed,
                  findings(sweep, groups), dict(sorted(statuses.items())))


def build_sweep_report(sweep_dir: str | Path, baseline: str | None = None) -> Report:
    """`lab-report SWEEP_DIR`: collect the job directories and write the report next to them."""
    return build_report(collect_sweep(sweep_dir), sweep_dir, baseline)


def log_report_to_wandb(report: Report, project: str, group: str, mode: str | None = None, entity: str | None = None) -> str | None:
    """One extra wandb run per sweep (job_type 'report'): the runs table, every figure, the findings
    (summary text and a table) and report.html itself (as a wandb HTML panel and a saved file).

    Returns the run id. The job runs stay untouched; `lab-report --wandb` leaves this run out.
    """
    import csv

    import wandb

    with report.runs_csv.open(newline="") as handle:
        rows = list(csv.reader(handle))
    run = wandb.init(
        project=project, entity=entity, group=group, job_type="report", name=f"report-{group}",
        dir=str(report.out_dir), mode=mode or os.environ.get("WANDB_MODE", "offline"), reinit="create_new",
        config={"sweep_dir": str(report.out_dir)},
    )
    try:
        run.log({"runs": wandb.Table(columns=rows[0], data=rows[1:])})
        run.log({f"figures/{path.stem}": wandb.Image(str(path)) for path in report.figures})
        run.log({"findings": wandb.Table(columns=["finding"], data=[[line] for line in report.findings]),
                 "report": wandb.Html(report.html.read_text())})
        run.save(str(report.html), base_path=str(report.out_dir), policy="now")
        run.summary.update({"jobs_ok": report.n_ok, "jobs_failed": report.n_failed, "findings": "\n".join(report.findings)})
        return run.id
    finally:
        run.finish()

"""report.md and a self-contained report.html (inline CSS, figures embedded as base64 PNG)."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from lab.report.sweep_figures import order_key
from lab.report.records import Sweep
from lab.report.table import (
    Variant,
    mean_spread,
    seed_count,
    steps_done,
    sweep_dimensions,
)


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def horizon_columns(variants: list[Variant]) -> int:
    return max((v.max_k for v in variants if v.ok), default=1)


def summary_lines(sweep: Sweep, variants: list[Variant]) -> list[str]:
    records = sweep.records
    times = [r["run_time_s"] for r in records if r["run_time_s"] is not None]
    dims = sweep_dimensions(records)
    lines = [
        f"- source: `{sweep.source}`",
        f"- jobs: {len(records)} ({len(sweep.completed)} ok, {len(sweep.failed)} failed)",
        f"- sweep dimensions: {', '.join(f'`{d}`' for d in dims) if dims else 'none (a single configuration)'}",
        f"- seeds per variant: {seed_count(records)} (metrics are mean ± sample sd over seeds when > 1)",
    ]
    if times:
        lines.append(f"- summed job run time: {sum(times):.1f} s")
    return lines


def shown_overrides(record: dict, dims: list[str]) -> str:
    """The overrides that tell this job apart from the others (all of them when none differ)."""
    shown = [o for o in record["overrides"] if o.partition("=")[0] in dims] or record["overrides"]
    return " ".join(shown) or record["name"]


def findings(sweep: Sweep, variants: list[Variant]) -> list[str]:
    """Plain statements computed from the numbers in the tables (no judgement beyond them)."""
    out = []
    scored = sorted((v for v in variants if v.stat("val/loss")[0] is not None), key=lambda v: v.stat("val/loss")[0])
    if scored:
        best = scored[0]
        out.append(f"Lowest validation next-token loss: **{best.label}** ({best.cell('val/loss')} nats).")
        baseline = next((v for v in scored if v.head == "ntp"), None)
        if baseline is not None and len(scored) > 1:
            base = baseline.stat("val/loss")[0]
            deltas = [f"{v.label} {v.stat('val/loss')[0] - base:+.4f}" for v in sorted(scored, key=order_key) if v is not baseline]
            out.append(f"Difference to the ntp baseline ({base:.4f}): " + "; ".join(deltas) + " (negative = better than ntp).")
        worst = scored[-1]
        if worst is not best:
            out.append(f"Highest: **{worst.label}** ({worst.cell('val/loss')}); spread across variants "
                       f"{worst.stat('val/loss')[0] - best.stat('val/loss')[0]:.4f} nats.")
    multi = [v for v in sorted(variants, key=order_key) if v.max_k > 1 and v.stat(f"val/loss/h{v.max_k}")[0] is not None]
    if multi:
        rising = [v for v in multi if all(
            (v.stat(f"val/loss/h{k}")[0] or 0) <= (v.stat(f"val/loss/h{k + 1}")[0] or 0) for k in range(1, v.max_k))]
        parts = [f"{v.label}: h1 {v.stat('val/loss/h1')[0]:.3f} → h{v.max_k} {v.stat(f'val/loss/h{v.max_k}')[0]:.3f}" for v in multi]
        out.append(f"Per-horizon validation loss rises with the horizon in {len(rising)} of {len(multi)} multi-token variants ("
                   + "; ".join(parts) + ").")
        accs = [f"{v.label}: h{v.max_k} {v.stat(f'val/acc/h{v.max_k}')[0]:.3f}" for v in multi if v.stat(f"val/acc/h{v.max_k}")[0] is not None]
        if accs:
            out.append("Top-1 accuracy at the farthest horizon: " + "; ".join(accs) + ".")
    if sweep.failed:
        dims = sweep_dimensions(sweep.records)
        out.append(f"{len(sweep.failed)} job(s) failed: " + "; ".join(f"job {r['job']} ({shown_overrides(r, dims)}): {r['error']}" for r in sweep.failed) + ".")
    return out


def run_table(sweep: Sweep, variants: list[Variant]) -> tuple[list[str], list[list[str]]]:
    max_k = horizon_columns(variants)
    dims = sweep_dimensions(sweep.records)
    header = ["job", "overrides", "status", "val/loss", "val/bpb", *[f"val/loss/h{k}" for k in range(1, max_k + 1)], "steps logged", "run time (s)", "failure reason"]
    rows = []
    for r in sweep.records:
        rows.append([
            fmt(r["job"]), shown_overrides(r, dims), r["status"], fmt(r["final"].get("val/loss")), fmt(r["final"].get("val/bpb")),
            *[fmt(r["final"].get(f"val/loss/h{k}")) for k in range(1, max_k + 1)],
            fmt(steps_done(r)), fmt(r["run_time_s"], 1), r["error"] or "",
        ])
    return header, rows


def variant_table(variants: list[Variant]) -> tuple[list[str], list[list[str]]]:
    max_k = horizon_columns(variants)
    header = ["variant", "head", "K", "n ok / jobs", "val/loss", "val/bpb",
              *[f"val/loss/h{k}" for k in range(1, max_k + 1)], *[f"val/acc/h{k}" for k in range(1, max_k + 1)], "est tokens/forward (val)", "run time (s)"]
    rows = []
    for v in sorted(variants, key=order_key):
        times = mean_spread([r["run_time_s"] for r in v.ok if r["run_time_s"] is not None])[0]
        rows.append([
            v.label, fmt(v.head), fmt(v.k), f"{len(v.ok)} / {len(v.records)}", v.cell("val/loss"), v.cell("val/bpb"),
            *[v.cell(f"val/loss/h{k}") for k in range(1, max_k + 1)], *[v.cell(f"val/acc/h{k}", 3) for k in range(1, max_k + 1)],
            v.cell("val/est_tokens_per_forward", 2), fmt(times, 1),
        ])
    return header, rows


def md_escape(cell: str) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(md_escape(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return lines


def markdown(sweep: Sweep, variants: list[Variant], figures: list[tuple[str, str, Path | None]], figures_rel: str) -> str:
    lines = [f"# Sweep report: {sweep.name}", "", *summary_lines(sweep, variants), "", "## Findings", ""]
    lines += [f"- {line}" for line in findings(sweep, variants)] or ["- no completed runs"]
    lines += ["", "## Variants (mean ± sd over seeds)", "", *md_table(*variant_table(variants))]
    lines += ["", "## Jobs", "", *md_table(*run_table(sweep, variants))]
    if sweep.failed:
        lines += ["", "## Failed jobs", ""]
        lines += [f"- job {r['job']} `{r['run_dir'] or r['name']}`: **{r['status']}**: {r['error']}" for r in sweep.failed]
    lines += ["", "## Figures", ""]
    for name, caption, path in figures:
        if path is None:
            lines += [f"- {caption}: not drawn (no such metric in this sweep)", ""]
        else:
            lines += [f"### {caption}", "", f"![{caption}]({figures_rel}/{name})", ""]
    lines += ["", "All numbers come from `runs.csv` (final metrics of each job); rebuild with `lab-report <sweep dir>`.", ""]
    return "\n".join(lines)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,td:nth-child(2){text-align:left}tr.failed td{background:#fde8e8}
img{max-width:100%;border:1px solid #eee}code{background:#f5f5f5;padding:0 3px}.reason{text-align:left;color:#a00}
"""


def html_table(header: list[str], rows: list[list[str]], failed_rows: set[int] | None = None) -> str:
    out = ["<table>", "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr>"]
    for index, row in enumerate(rows):
        css = ' class="failed"' if failed_rows and index in failed_rows else ""
        out.append(f"<tr{css}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def inline_md(text: str) -> str:
    """The tiny subset of markdown the findings use: **bold** and `code`."""
    escaped = html.escape(text)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)


def html_page(sweep: Sweep, variants: list[Variant], figures: list[tuple[str, str, Path | None]]) -> str:
    parts = [
        "<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">",
        f"<title>Sweep report: {html.escape(sweep.name)}</title>", f"<style>{CSS}</style>", "</head><body>",
        f"<h1>Sweep report: {html.escape(sweep.name)}</h1>", "<ul>",
    ]
    parts += [f"<li>{inline_md(line[2:])}</li>" for line in summary_lines(sweep, variants)]
    parts += ["</ul>", "<h2>Findings</h2>", "<ul>"]
    parts += [f"<li>{inline_md(line)}</li>" for line in findings(sweep, variants)] or ["<li>no completed runs</li>"]
    parts += ["</ul>", "<h2>Variants (mean ± sd over seeds)</h2>", html_table(*variant_table(variants))]
    header, rows = run_table(sweep, variants)
    failed = {i for i, r in enumerate(sweep.records) if r["status"] != "ok"}
    parts += ["<h2>Jobs</h2>", html_table(header, rows, failed)]
    parts.append("<h2>Figures</h2>")
    for name, caption, path in figures:
        if path is None:
            parts.append(f"<p><em>{html.escape(caption)}: not drawn (no such metric in this sweep)</em></p>")
            continue
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        parts += [f"<h3>{html.escape(caption)}</h3>", f'<img alt="{html.escape(caption)}" src="data:image/png;base64,{data}">']
    parts += ["<p>Rebuild with <code>lab-report &lt;sweep dir&gt;</code>; the numbers are those of <code>runs.csv</code>.</p>", "</body></html>", ""]
    return "\n".join(parts)

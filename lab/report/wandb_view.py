"""A wandb dry run (`lab-report ... --publish --dry-run FILE`) seen offline, and published later.

The dry-run file holds the pydantic models that `Report.save()` / `Workspace.save()` would send
(lab/report/wandb_report.py `serialised`), keyed "report" and "workspace". `write_view` renders them
as one self-contained HTML page: the title, the Markdown block (the findings), and every section with
its panels (kind, title, metrics, x axis, aggregation) and the run set they would show (filters,
grouping). The charts themselves are drawn by wandb from the runs' data, which the file does not hold;
the page shows what the Report will contain, so it can be checked before anything is saved.

`publish_dry_run` rebuilds the library objects from the file and saves them into ENTITY/PROJECT (the
run sets name no project: they show that project's runs, so publish where the runs were synced).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from lab.report.atomic import write_text_atomic
from lab.report.records import ReportError
from lab.report.render import CSS, inline_md

KINDS = ("report", "workspace")
VIEW_CSS = """
.panels{display:grid;grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:0.6em}
.panel{border:1px solid #ccc;border-radius:4px;padding:0.5em 0.7em;font-size:13px}.panel b{display:block;margin-bottom:0.2em}
.kind{color:#666;font-size:12px}.runset{color:#444;font-size:13px;margin:0.3em 0}.note{color:#555}
"""


def read_dry_run(path: str | Path, field: str) -> dict:
    """The dry-run file's {"report": ..., "workspace": ...} (at least one), or one line saying what is wrong with it."""
    source = Path(path)
    if not source.is_file():
        raise ReportError(f"{field}: {path}: no such file")
    try:
        payload = json.loads(source.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ReportError(f"{field}: {path}: not JSON ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})") from None
    if not isinstance(payload, dict) or not any(isinstance(payload.get(kind), dict) for kind in KINDS):
        raise ReportError(f"{field}: {path}: not a lab-report --dry-run file (no 'report' or 'workspace' object)")
    return payload


# ---- the offline page -------------------------------------------------------------------------


def markdown_html(text: str) -> list[str]:
    """The Markdown the Report's text block uses: '## ' headings, '- ' bullets, paragraphs, **bold**, `code`."""
    out, in_list = [], False
    for line in text.splitlines():
        bullet = line.startswith("- ")
        if in_list and not bullet:
            out.append("</ul>")
            in_list = False
        if bullet:
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{inline_md(line[2:])}</li>")
        elif line.startswith("#"):
            level = min(len(line) - len(line.lstrip("#")) + 1, 4)
            out.append(f"<h{level}>{inline_md(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            out.append(f"<p>{inline_md(line)}</p>")
    return out + (["</ul>"] if in_list else [])


def panel_card(panel: dict) -> str:
    config = panel.get("config") or {}
    title = config.get("chartTitle") or ", ".join(config.get("metrics") or []) or panel.get("viewType", "panel")
    facts = []
    if config.get("metrics"):
        facts.append("metrics: " + ", ".join(f"<code>{html.escape(m)}</code>" for m in config["metrics"]))
    if config.get("xAxis"):
        facts.append(f"x: <code>{html.escape(config['xAxis'])}</code>")
    if config.get("groupAgg"):
        facts.append(f"groups: {html.escape(config['groupAgg'])} ± {html.escape(str(config.get('groupArea') or '—'))}")
    if config.get("mediaKeys"):
        facts.append("media: " + ", ".join(f"<code>{html.escape(m)}</code>" for m in config["mediaKeys"]))
    if config.get("columns"):
        names = [(c.get("accessor") or c.get("displayName") or "") for c in config["columns"] if isinstance(c, dict)]
        facts.append("columns: " + ", ".join(f"<code>{html.escape(n)}</code>" for n in names))
    if "value" in config and isinstance(config["value"], str):
        return f'<div class="panel"><span class="kind">{html.escape(panel.get("viewType", ""))}</span>{"".join(markdown_html(config["value"]))}</div>'
    return (f'<div class="panel"><b>{html.escape(str(title))}</b><span class="kind">{html.escape(panel.get("viewType", ""))}</span>'
            + "".join(f"<div>{fact}</div>" for fact in facts) + "</div>")


def filter_text(filters: dict) -> str:
    parts = []
    for item in (filters or {}).get("filters") or []:
        if not isinstance(item, dict) or item.get("disabled"):
            continue
        if "key" in item:
            parts.append(f"{item['key'].get('name')} {item.get('op')} {item.get('value')!r}")
        else:
            parts.append(filter_text(item))
    return " and ".join(p for p in parts if p)


def runset_line(runset: dict) -> str:
    grouping = ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in runset.get("grouping") or [])
    return (f'<p class="runset">runs: {html.escape(runset.get("name") or "")} — {html.escape(filter_text(runset.get("filters")) or "all")}'
            f"; grouped by {html.escape(grouping or 'nothing')}</p>")


def report_html(report: dict) -> list[str]:
    project = report.get("project") or {}
    out = [f'<h1 id="report">{html.escape(report.get("displayName") or "wandb report")}</h1>',
           f'<p class="note">wandb Report for <code>{html.escape(str(project.get("entityName") or "ENTITY"))}/'
           f'{html.escape(str(project.get("name") or ""))}</code>: {inline_md(report.get("description") or "")}</p>']
    for block in (report.get("spec") or {}).get("blocks") or []:
        kind = block.get("type")
        if kind == "markdown-block":
            out += markdown_html(block.get("content") or "")
        elif kind == "heading":
            text = "".join(child.get("text", "") for child in block.get("children") or [])
            out.append(f"<h2>{html.escape(text)}</h2>")
        elif kind == "panel-grid":
            metadata = block.get("metadata") or {}
            out += [runset_line(runset) for runset in metadata.get("runSets") or []]
            panels = (metadata.get("panelBankSectionConfig") or {}).get("panels") or []
            out.append('<div class="panels">' + "".join(panel_card(p) for p in panels) + "</div>")
    return out


def workspace_html(workspace: dict) -> list[str]:
    section = (workspace.get("spec") or {}).get("section") or {}
    out = [f'<h1 id="workspace">{html.escape(workspace.get("displayName") or "wandb workspace")}</h1>',
           f'<p class="note">wandb Workspace view for <code>{html.escape(str(workspace.get("entity") or "ENTITY"))}/'
           f'{html.escape(str(workspace.get("project") or ""))}</code></p>']
    out += [runset_line(runset) for runset in section.get("runSets") or []]
    for part in (section.get("panelBankConfig") or {}).get("sections") or []:
        if not part.get("panels"):
            continue
        out += [f"<h2>{html.escape(part.get('name') or '')}</h2>",
                '<div class="panels">' + "".join(panel_card(p) for p in part["panels"]) + "</div>"]
    return out


def view_html(payload: dict, source: str) -> str:
    report, workspace = payload.get("report"), payload.get("workspace")
    title = (report or {}).get("displayName") or (workspace or {}).get("displayName") or "wandb dry run"
    parts = ["<!DOCTYPE html>", '<html><head><meta charset="utf-8">', f"<title>{html.escape(title)} (wandb dry run)</title>",
             f"<style>{CSS}{VIEW_CSS}</style>", "</head><body>",
             f'<p class="note">Offline view of the wandb dry run <code>{html.escape(source)}</code>: what would be saved, panel by panel; '
             "wandb draws the charts from the runs' data when it is published (<code>lab-report --publish-from FILE "
             "ENTITY/PROJECT</code>).</p>"]
    if report and workspace:
        parts.append('<nav class="toc"><a href="#report">Report</a><a href="#workspace">Workspace</a></nav>')
    if isinstance(report, dict):
        parts += report_html(report)
    if isinstance(workspace, dict):
        parts += workspace_html(workspace)
    return "\n".join([*parts, "</body></html>", ""])


def write_view(path: str | Path, out: str | Path | None = None) -> Path:
    """`lab-report --view FILE [--out PAGE.html]`: the dry run as a local page (default: FILE's name with .view.html, so
    a dry run called report.json never replaces the sweep's own report.html)."""
    payload = read_dry_run(path, "--view")
    target = Path(out) if out else Path(path).with_suffix(".view.html")
    if target.resolve() == Path(path).resolve():
        raise ReportError(f"--out: {out} is the dry-run file itself")
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(target, view_html(payload, str(path)))


# ---- publishing later ---------------------------------------------------------------------------


def publish_dry_run(path: str | Path, target: str, title: str | None = None) -> list[tuple[str, str]]:
    """Save the dry run's Report and/or Workspace into ENTITY/PROJECT; [(kind, url)]. Every refusal is one line."""
    from lab.report.wandb_report import wandb_workspaces

    field = "--publish-from"
    if target.count("/") != 1 or not all(target.split("/")):
        raise ReportError(f"{field}: where to save must be ENTITY/PROJECT, got '{target}'")
    payload = read_dry_run(path, field)
    wr, ws, _ = wandb_workspaces(field=field)
    from wandb_workspaces.reports.v2 import internal as report_internal
    from wandb_workspaces.workspaces import internal as workspace_internal

    entity, project = target.split("/")
    built = []
    try:
        if isinstance(payload.get("report"), dict):
            report = wr.Report._from_model(report_internal.ReportViewspec.model_validate(payload["report"]))
            report.entity, report.project = entity, project
            if title:
                report.title = title[:128]
            built.append(("report", report))
        if isinstance(payload.get("workspace"), dict):
            workspace = ws.Workspace._from_model(workspace_internal.View.model_validate(payload["workspace"]))
            workspace.entity, workspace.project = entity, project
            built.append(("workspace", workspace))
    except Exception as error:  # pydantic validation: a file edited by hand, or written by another wandb-workspaces
        raise ReportError(f"{field}: {path}: not a model wandb-workspaces can read ({type(error).__name__}: "
                          f"{(str(error).splitlines() or [''])[0]})") from None
    saved = []
    for kind, obj in built:
        try:
            saved.append((kind, obj.save().url))
        except Exception as error:  # network, login, permissions
            message = (str(error).splitlines() or [""])[0]
            raise ReportError(f"{field}: {kind} not saved to {target}: {type(error).__name__}: {message} "
                              f"(needs network and `wandb login`; the file is unchanged, run this again later)") from None
    return saved

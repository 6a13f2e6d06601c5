"""A sweep as a wandb Report (and a saved Workspace view), built with wandb's own `wandb-workspaces`.

What a Report shows follows the data: a panel exists for each metric key the job runs logged
(a horizon no run reached gets no panel, decoding panels appear once runs log `decode/*`).
Its run sets hold the sweep's job runs (wandb group = the sweep name, the report run left
out), grouped by the sweep dimensions, each resolved to the key it has in the runs' wandb
configs. The Markdown block carries the findings exactly as report.md words them.

`publish(...)` saves through the library (network); `dry_run_json(...)` writes the pydantic
model that the same save would send, without network: this is how the builder is tested.
Run sets name no project of their own, so they show the runs of the Report's entity/project
(the library would otherwise look the project's internal id up over the network).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from lab.report.atomic import write_text_atomic
from lab.report.head_traits import traits_of
from lab.report.sweep_figures import REPORT_FIGURES, grad_cosine_heatmaps
from lab.report.records import ReportError, Sweep, override_items
from lab.report.render import default_title, findings, summary_lines
from lab.report.table import SEED_KEYS, sweep_dimensions, variants

INSTALL_HINT = "pip install -e '.[wandb-reports]'"
DRY_RUN_FILE = "wandb_report.json"  # in the sweep dir when report.wandb_publish meets an offline sweep
REPORT_JOB_TYPE = "report"  # the sweep's own report run (lab.report.build.log_report_to_wandb)
X_AXIS = "trainer/global_step"  # Lightning's step; wandb's own `_step` counts log calls, not steps
HORIZON_KEY = re.compile(r"^(?P<base>.+)/h(?P<k>\d+)$")
DECODING_KEY = re.compile(r"^(decode/.+|val/agree(_chain)?/h\d+|val/est_tokens_per_forward)$")
GRAD_COSINE_KEY = re.compile(r"^grad/cos/")
# the report run logs each figure as figures/<png stem> (lab.report.build.log_report_to_wandb)
GRAD_COSINE_MEDIA = "figures/" + Path(next(name for name, draw, _ in REPORT_FIGURES if draw is grad_cosine_heatmaps)).stem
LOGIT_MEMORY_KEYS = ("mem/logits_live_bytes", "mem/saved_peak_bytes")
TEACHER_FORCED_NOTE = "DeepSeek depths teacher-forced; independent heads predict blind"


def wandb_workspaces(field: str = "--publish"):
    """(reports v2, workspaces, expr) of the optional extra, or one line naming the install command."""
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
        from wandb_workspaces import expr
    except ImportError:
        raise ReportError(f"{field}: needs the optional package wandb-workspaces; install it with: {INSTALL_HINT}") from None
    return wr, ws, expr


# ---- which keys the runs logged ------------------------------------------------------------


def logged_keys(sweep: Sweep) -> set[str]:
    """Every metric name any job logged (history) or ended with (final metrics)."""
    keys: set[str] = set()
    for record in sweep.records:
        keys |= set(record["history"]) | set(record["final"])
    return keys


def horizon_keys(keys: set[str], base: str) -> list[str]:
    """`{base}/h{k}` keys present, ordered by k (h2 before h10)."""
    found = [(int(m.group("k")), name) for name in keys if (m := HORIZON_KEY.match(name)) and m.group("base") == base]
    return [name for _, name in sorted(found)]


# ---- sweep dimensions → wandb config keys --------------------------------------------------------


def leaves(config: dict, prefix: str = "") -> dict[str, object]:
    """Nested config → {dotted path: leaf value}."""
    out: dict[str, object] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(leaves(value, path + "."))
        else:
            out[path] = value
    return out


def comparable(value) -> object:
    """An override string and a config value compare equal when they denote the same value (3e-3 == 0.003)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    text = str(value).strip()
    if text.lower() in ("true", "false", "null", "none"):
        return {"none": "null"}.get(text.lower(), text.lower())
    try:
        number = float(text)
    except ValueError:
        return text
    return number if math.isfinite(number) else text


def config_key(dimension: str, override_values: set[str], configs: list[dict]) -> str | None:
    """The dotted wandb-config path that holds a sweep dimension, or None when no config holds it.

    Candidates, first match wins: the override path itself (`head.k`, `optim.lr`); a leaf under a
    config group whose value is the group choice (`head=parallel` → `head.name`); the last path
    segment anywhere (Lightning logs the DataModule's arguments at top level: `data.seq_len` →
    `seq_len`). A candidate holds when every config has it and either its values are the override values, or — where
    the configs carry their job's `overrides` — it tells apart every two jobs that differ in this dimension alone (a
    resolved value may differ from the override: ntp's `head.k` is 1 in a `head.k=2,4` grid, and still the K=2 and
    K=4 jobs of every other head hold 2 and 4, as the local report's variants do).
    """
    flat = [leaves(config) for config in configs]
    if not flat:
        return None
    wanted = {comparable(v) for v in override_values}
    path = dimension.lstrip("+")
    last = path.rsplit(".", 1)[-1]
    common = set.intersection(*(set(f) for f in flat))
    under = sorted((p for p in common if p.startswith(path + ".")), key=lambda p: (p != f"{path}.name", p))
    elsewhere = sorted((p for p in common if p == last or p.endswith("." + last)), key=lambda p: (p.count("."), p))
    for candidate in [path, *under, *elsewhere]:
        if candidate in common and ({comparable(f[candidate]) for f in flat} == wanted or separates(candidate, dimension, configs, flat)):
            return candidate
    return None


def separates(candidate: str, dimension: str, configs: list[dict], flat: list[dict]) -> bool:
    """Whether `candidate` differs between every two jobs whose overrides differ in `dimension` alone (seeds aside):
    grouping by it then splits what the local report's variants split."""
    if not all(config.get("overrides") for config in configs):
        return False
    jobs = []
    for config, values in zip(configs, flat):
        items = dict(override_items(config["overrides"]))
        rest = frozenset((k, v) for k, v in items.items() if k != dimension and k not in SEED_KEYS)
        jobs.append((rest, items.get(dimension), comparable(values[candidate])))
    pairs = [(a, b) for i, a in enumerate(jobs) for b in jobs[i + 1:] if a[0] == b[0] and a[1] != b[1]]
    if not pairs:  # it never varies alone (deepseek's head.depth follows head.k): its own path is enough
        return candidate == dimension.lstrip("+")
    return all(a[2] != b[2] for a, b in pairs)


@dataclass
class Grouping:
    keys: list[str] = field(default_factory=list)  # dotted wandb config paths, in dimension order
    unresolved: list[str] = field(default_factory=list)  # dimensions no run config holds


def grouping(sweep: Sweep, configs: list[dict]) -> Grouping:
    """The sweep dimensions (seeds aside: runs that differ only by seed are one variant) as wandb config keys."""
    out = Grouping()
    for dimension in sweep_dimensions(sweep.records):
        if dimension in SEED_KEYS:
            continue
        values = {v for r in sweep.records for k, v in override_items(r["overrides"]) if k == dimension}
        key = config_key(dimension, values, configs)
        if key is None:
            out.unresolved.append(dimension)
        elif key not in out.keys:
            out.keys.append(key)
    return out


# ---- content: sections of panels, shared by the Report and the Workspace ---------------------------


@dataclass
class Section:
    title: str
    panels: list = field(default_factory=list)
    report_run: bool = False  # the panels show the sweep's report run (its logged figures), not the jobs


@dataclass
class Content:
    title: str
    markdown: str
    sections: list[Section]
    grouping: Grouping
    group: str
    table_columns: list[str]


def findings_markdown(sweep: Sweep, grouping_: Grouping) -> str:
    """The findings exactly as report.md writes them, under the sweep's summary lines."""
    groups = variants(sweep.records)
    lines = [*summary_lines(sweep, groups), "", "## Findings", ""]
    lines += [f"- {line}" for line in findings(sweep, groups)] or ["- no completed runs"]
    if grouping_.unresolved:
        lines += ["", "Not grouped by (no run config holds them): " + ", ".join(f"`{d}`" for d in grouping_.unresolved) + "."]
    return "\n".join(lines)


def horizon_note(sweep: Sweep, key: str) -> str:
    """A DeepSeek depth's k ≥ 2 metrics are teacher-forced (it sees the true earlier tokens); say so where they meet blind heads."""
    match = HORIZON_KEY.match(key)
    if not match or int(match.group("k")) < 2:
        return ""
    forced = [traits_of(r).teacher_forced for r in sweep.completed]
    if not any(forced):
        return ""
    return " (teacher-forced)" if all(forced) else f" ({TEACHER_FORCED_NOTE})"


@dataclass
class Panels:
    """What a section builder needs: the library, the sweep, the logged keys, the grouping keys."""

    wr: object
    sweep: Sweep
    keys: set[str]
    grouping: Grouping
    aggregate: dict = field(default_factory=lambda: {"groupby_aggfunc": "mean", "groupby_rangefunc": "stddev"})  # mean ± sd over seeds

    def line(self, keys: list[str], title: str) -> object:
        return self.wr.LinePlot(title=title, x=X_AXIS, y=keys, title_x=X_AXIS, **self.aggregate)

    def horizon_lines(self, *bases: str) -> list:
        return [self.line([key], key + horizon_note(self.sweep, key)) for base in bases for key in horizon_keys(self.keys, base)]

    def bar(self, key: str, title: str = "") -> object:
        # y-axis from zero: the x-axis range of a wandb bar chart is its value axis
        return self.wr.BarPlot(title=title or key, metrics=[key], orientation="v", range_x=(0, None), **self.aggregate)


def val_loss_bars(p: Panels) -> list:
    return [p.bar("val/loss", "final val/loss (nats), mean ± sd over seeds")] if "val/loss" in p.keys else []


def grad_cosine_figure(p: Panels) -> list:
    """The report run's gradient-cosine figure (drawn whenever the jobs logged grad/cos)."""
    return [p.wr.MediaBrowser(title="gradient cosine (report run)", media_keys=[GRAD_COSINE_MEDIA])] if any(map(GRAD_COSINE_KEY.match, p.keys)) else []


def grad_cosine_lines(p: Panels) -> list:
    cosines = sorted(k for k in p.keys if GRAD_COSINE_KEY.match(k))
    return [p.line(cosines, "grad/cos")] if cosines else []


def effective_weights(p: Panels) -> list:
    weights = horizon_keys(p.keys, "train/weight_eff")
    return [p.line(weights, "train/weight_eff per horizon")] if weights else []


def logit_memory(p: Panels) -> list:
    return [p.bar(key, f"{key} (bytes)") for key in LOGIT_MEMORY_KEYS if key in p.keys]


def decoding(p: Panels) -> list:
    """decode/* first, then draft agreement; nothing until runs log them (lab.decode)."""
    return [p.bar(key) for key in sorted((k for k in p.keys if DECODING_KEY.match(k)), key=lambda k: (not k.startswith("decode/"), k))]


def dimensions_and_runs(p: Panels) -> list:
    columns = [p.wr.ParallelCoordinatesPlotColumn(metric=p.wr.Config(key)) for key in p.grouping.keys]
    out = [p.wr.RunComparer(diff_only="split")]
    if columns and "val/loss" in p.keys:
        target = p.wr.ParallelCoordinatesPlotColumn(metric=p.wr.SummaryMetric("val/loss"))
        out.insert(0, p.wr.ParallelCoordinatesPlot(title="sweep dimensions → val/loss", columns=[*columns, target]))
    return out


# (title, builder, shows the report run): in page order; a builder with no data returns no panels
SECTIONS = (
    ("Next-token validation loss by variant", val_loss_bars, False),
    ("Per-horizon loss", lambda p: p.horizon_lines("val/loss", "train/loss"), False),
    ("Per-horizon accuracy and chain acceptance", lambda p: p.horizon_lines("val/acc", "val/chain_acc"), False),
    ("Gradient cosine between horizons", grad_cosine_figure, True),
    ("Gradient cosine per run", grad_cosine_lines, False),
    ("Effective loss weights", effective_weights, False),
    ("Logit memory", logit_memory, False),
    ("Decoding", decoding, False),
    ("Sweep dimensions and runs", dimensions_and_runs, False),
)


def build_content(sweep: Sweep, configs: list[dict], *, group: str, title: str | None = None) -> Content:
    """The Report's text and panels for a sweep; `configs` are the job runs' wandb configs."""
    wr, _, _ = wandb_workspaces()
    if not sweep.completed:
        raise ReportError(f"{sweep.source}: no completed runs to put in a wandb report")
    keys = logged_keys(sweep)
    grouped = grouping(sweep, configs)
    panels = Panels(wr, sweep, keys, grouped)
    sections = [Section(name, found, report_run) for name, build, report_run in SECTIONS if (found := build(panels))]
    table = [f"summary:{key}" for key in ("val/loss", "val/bpb", *horizon_keys(keys, "val/loss")) if key in keys]
    return Content(
        title=title or default_title(sweep), markdown=findings_markdown(sweep, grouped), sections=sections,
        grouping=grouped, group=group, table_columns=table,
    )


# ---- the library objects ----------------------------------------------------------------------


def stable_id(*parts: str) -> str:
    """Deterministic panel/run-set ids: the same sweep gives the same JSON, byte for byte."""
    return hashlib.sha1("/".join(parts).encode()).hexdigest()[:12]


def job_filter(expr, group: str, report_run: bool = False) -> list:
    job_type = expr.Metric("JobType")
    return [expr.Metric("Group") == group, job_type == REPORT_JOB_TYPE if report_run else job_type != REPORT_JOB_TYPE]


def as_report(content: Content, *, entity: str, project: str):
    """Content → `wandb_workspaces.reports.v2.Report` (unsaved)."""
    wr, _, expr = wandb_workspaces()
    groupby = [f"config.{key}" for key in content.grouping.keys]
    config_columns = [f"config:{expr.groupby_str_to_key(g).name}" for g in groupby]
    blocks: list = [wr.MarkdownBlock(text=content.markdown)]
    for index, section in enumerate(content.sections):
        runset = wr.Runset(
            name="report run" if section.report_run else f"{content.group} jobs",
            filters=job_filter(expr, content.group, section.report_run),
            groupby=[] if section.report_run else groupby,
            pinned_columns=[] if section.report_run else ["run:displayName", *config_columns, *content.table_columns],
        )
        runset._id = stable_id(content.group, "runset", str(index))
        for number, panel in enumerate(section.panels):
            panel._id = stable_id(content.group, "panel", str(index), str(number))
        blocks += [wr.H2(text=section.title), wr.PanelGrid(runsets=[runset], panels=section.panels)]
    description = f"mtp-lab sweep `{content.group}`; grouped by " + (", ".join(content.grouping.keys) or "nothing (one configuration)")
    return wr.Report(entity=entity, project=project, title=content.title[:128], description=description, blocks=blocks, width="fluid")


def as_workspace(content: Content, *, entity: str, project: str, n_runs: int):
    """Content → `wandb_workspaces.workspaces.Workspace` (unsaved): the same sections over the group's job runs.

    A workspace has one run set, the job runs; the report run's figures are left out of it."""
    wr, ws, expr = wandb_workspaces()
    sections = [ws.Section(name="Findings", panels=[wr.MarkdownPanel(markdown=content.markdown)], is_open=True)]
    sections += [ws.Section(name=s.title, panels=s.panels, is_open=True) for s in content.sections if not s.report_run]
    for index, section in enumerate(sections):
        for number, panel in enumerate(section.panels):
            panel._id = stable_id(content.group, "workspace", str(index), str(number))
    return ws.Workspace(
        entity=entity, project=project, name=f"mtp-lab {content.group}"[:128], sections=sections,
        settings=ws.WorkspaceSettings(x_axis=X_AXIS, max_runs=max(10, n_runs)),
        runset_settings=ws.RunsetSettings(filters=job_filter(expr, content.group), groupby=[expr.Config(k) for k in content.grouping.keys]),
    )


def serialised(obj) -> dict:
    """The pydantic model `save()` sends (by alias, nulls dropped), as JSON-ready data."""
    return obj._to_model().model_dump(mode="json", by_alias=True, exclude_none=True)


# ---- entry points -------------------------------------------------------------------------------


@dataclass
class Published:
    report_url: str | None = None
    workspace_url: str | None = None
    dry_run: Path | None = None
    n_panels: int = 0


def publish(sweep: Sweep, configs: list[dict], *, entity: str | None, project: str, group: str, title: str | None = None,
            report: bool = True, workspace: bool = False, dry_run: str | Path | None = None) -> Published:
    """Build the Report and/or Workspace; save them (network) or, with `dry_run`, write their models to that JSON file."""
    content = build_content(sweep, configs, group=group, title=title)
    entity_kw = {"entity": entity} if entity else {}  # no entity: the library asks the API for the default one
    if dry_run is not None:
        entity_kw = {"entity": entity or ""}
    built = {}
    if report:
        built["report"] = as_report(content, project=project, **entity_kw)
    if workspace:  # its own panel objects: a panel belongs to one page
        workspace_content = build_content(sweep, configs, group=group, title=title)
        built["workspace"] = as_workspace(workspace_content, project=project, n_runs=len(sweep.records), **entity_kw)
    out = Published(n_panels=sum(len(s.panels) for s in content.sections))
    if dry_run is not None:
        path = Path(dry_run)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {name: serialised(obj) for name, obj in built.items()}
        write_text_atomic(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")
        out.dry_run = path
        return out
    try:
        if "report" in built:
            out.report_url = built["report"].save().url
        if "workspace" in built:
            out.workspace_url = built["workspace"].save().url
    except Exception as error:  # network, auth, permissions
        message = str(error).splitlines()[0] if str(error) else ""
        raise ReportError(f"wandb report for {entity or '<default entity>'}/{project} group {group}: {type(error).__name__}: {message}") from None
    return out


def job_configs(runs: list[dict]) -> list[dict]:
    return [run.get("config") or {} for run in runs if run.get("job_type") != REPORT_JOB_TYPE]


def publish_sweep_dir(sweep_dir: str | Path, *, entity: str | None, project: str, group: str | None = None, **options) -> Published:
    """A sweep directory's report as a wandb Report: the records (and so the findings) of report.md, the
    grouping keys from the wandb configs in the jobs' local run files."""
    from lab.report.records import collect_sweep
    from lab.report.wandb_local import local_runs

    sweep = collect_sweep(sweep_dir)
    group = group or sweep.name
    configs = job_configs(local_runs(sweep_dir, group))
    if not configs:
        raise ReportError(f"{sweep_dir}: no local wandb runs of group '{group}' (was the wandb logger on? --group names another group)")
    return publish(sweep, configs, entity=entity, project=project, group=group, **options)



def publish_after_sweep(sweep_dir: str | Path, *, project: str, entity: str | None, group: str, online: bool, workspace: bool) -> str:
    """`report.wandb_publish=true` at the end of a multirun: save when wandb is online, else write the dry run."""
    dry_run = None if online else Path(sweep_dir) / DRY_RUN_FILE
    done = publish_sweep_dir(sweep_dir, entity=entity, project=project, group=group, workspace=workspace, dry_run=dry_run)
    if dry_run is not None:
        where = f"{entity}/{project}" if entity else "ENTITY/" + project
        return (f"wandb report: offline, so nothing published; what would be saved: {dry_run}; publish after `wandb sync` with: "
                f"lab-report {sweep_dir} --wandb {where} --group {group} --publish" + (" --workspace" if workspace else ""))
    return "; ".join(f"wandb {kind}: {url}" for kind, url in (("report", done.report_url), ("workspace", done.workspace_url)) if url)

"""Several sweep folders in one report: `lab-report DIR1 DIR2 ... --out OUT`.

The folders' records are pooled into one `Sweep` (jobs numbered on in folder order, each run_dir led by its folder's
name) when their runs were trained alike apart from what the sweeps varied: every setting that no folder varies — the
compared settings each run.json records (corpus fingerprint, tokenizer, trunk shape, step budget, sequence length,
batch size) and every override a folder gives all its jobs with one value — must be the same in every folder that
has it. Otherwise the list is refused in one line naming each difference, before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path

from lab.report.records import ReportError, Sweep, collect_sweep, override_items
from lab.report.table import sweep_dimensions
# What must match for runs of different sweeps to share one report, unless either sweep varies it: (name, reader).
# The readers take a job's run.json payload; None = not recorded (a run written before the field: not compared).
def _manifest(payload: dict) -> dict:
    return payload.get("manifest") or {}


def _model_field(name: str):
    return lambda p: (_manifest(p).get("model") or (p.get("config") or {}).get("model") or {}).get(name)


COMPARED_SETTINGS = (
    ("data corpus fingerprint", lambda p: _manifest(p).get("corpus_fingerprint")),
    ("tokenizer", lambda p: _manifest(p).get("tokenizer")),
    *((f"model.{name}", _model_field(name)) for name in ("d_model", "n_layers", "n_heads", "mlp_ratio", "vocab_size", "name", "path")),
    ("trainer.max_steps", lambda p: ((p.get("config") or {}).get("trainer") or {}).get("max_steps")),
    ("data.seq_len", lambda p: _manifest(p).get("seq_len")),
    ("data.batch_size", lambda p: _manifest(p).get("batch_size")),
)
# Overrides that name where and how a job was recorded, not what it trained: never a reason to refuse pooling.
BOOKKEEPING_KEYS = ("sweep_name", "run_name", "tags", "paths.", "logger.", "report.", "hydra.", "callbacks.progress")


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)


def shown_value(value: str) -> str:
    return value if len(value) <= 32 else value[:12] + "…"


def job_payloads(sweep: Sweep) -> list[dict]:
    return [read_payload(Path(sweep.source) / r["run_dir"]) for r in sweep.records if r["run_dir"]]


def recorded_values(sweep: Sweep) -> dict[str, set[str]]:
    """{compared setting: the values its jobs recorded}."""
    payloads = job_payloads(sweep)
    return {name: {canonical(v) for v in map(read, payloads) if v is not None} for name, read in COMPARED_SETTINGS}


def bookkeeping(key: str) -> bool:
    key = key.lstrip("+~")
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in BOOKKEEPING_KEYS)


def fixed_settings(sweep: Sweep, recorded: dict[str, set[str]]) -> dict[str, str]:
    """{setting: value} of what one sweep holds at a single value in every job that recorded it: the compared settings
    (`recorded`: from each job's run.json) and every override that all its jobs give with one value."""
    out = {name: next(iter(values)) for name, values in recorded.items() if len(values) == 1}
    dims = set(sweep_dimensions(sweep.records))
    for key, value in override_items(sweep.records[0]["overrides"] if sweep.records else []):
        if key not in dims and key not in out and not bookkeeping(key):
            out[key] = value
    return out


def varied_settings(sweep: Sweep, recorded: dict[str, set[str]]) -> set[str]:
    """The settings a sweep varies: its override dimensions and the compared settings with more than one value."""
    varied = {key.lstrip("+~") for key in sweep_dimensions(sweep.records)}
    return varied | {name for name, values in recorded.items() if len(values) > 1}


def read_payload(job_dir: Path) -> dict:
    try:
        return json.loads((job_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def incompatibilities(sweeps: list[Sweep], labels: list[str] | None = None) -> list[str]:
    """'SETTING A (label1) vs B (label2)' for every setting that no sweep of the list varies and that differs between two
    of them (a setting one sweep does not record or set is not compared: its default is not known here)."""
    labels = labels or [Path(s.source).name for s in sweeps]
    recorded = [recorded_values(s) for s in sweeps]  # each job's run.json read once
    varied = set().union(*(varied_settings(s, r) for s, r in zip(sweeps, recorded)))
    fixed = [fixed_settings(s, r) for s, r in zip(sweeps, recorded)]
    out = []
    names = list(dict.fromkeys(name for settings in fixed for name in settings))
    for name in names:
        if name.lstrip("+~") in varied:
            continue
        held = [(label, settings[name]) for label, settings in zip(labels, fixed) if name in settings]
        if len({value for _, value in held}) > 1:
            out.append(f"{name} " + " vs ".join(f"{shown_value(value)} ({label})" for label, value in held))
    return out


def pool_sweeps(sweeps: list[Sweep]) -> Sweep:
    """Several sweeps' records as one sweep: jobs numbered on in folder order, each run_dir led by its folder's name.

    Refused (ReportError, one line) when a setting that none of them varies differs between them (`incompatibilities`:
    e.g. another corpus, model size or step budget), or when one job's settings (seed included) appear in two folders."""
    if len(sweeps) == 1:
        return sweeps[0]
    sources = [s.source for s in sweeps]
    if len({Path(source).resolve() for source in sources}) < len(sources):
        raise ReportError(f"{', '.join(sources)}: a sweep folder is given twice")
    labels = folder_labels([Path(source) for source in sources])
    differ = incompatibilities(sweeps, labels)
    if differ:
        raise ReportError(f"{' + '.join(sources)}: not one comparable set of runs: " + "; ".join(differ)
                          + " (settings that no folder varies must match to pool the folders' runs)")
    seen: dict[tuple, str] = {}
    records = []
    for sweep, label in zip(sweeps, labels):
        for record in sweep.records:
            identity = tuple(sorted(record["overrides"]))
            if identity in seen and identity:
                raise ReportError(f"{' + '.join(sources)}: the job '{' '.join(record['overrides'])}' is in both {seen[identity]} and "
                                  f"{label}: pooling would count its runs twice")
            seen[identity] = label
            records.append({**record, "job": len(records), "run_dir": f"{label}/{record['run_dir'] or record['name']}", "folder": label})
    names = list(dict.fromkeys(s.name for s in sweeps))
    return Sweep(name=" + ".join(names), source=" + ".join(sources), records=records, folders=sources)


def folder_labels(paths: list[Path]) -> list[str]:
    """Each folder's shortest distinct tail ('16-35-34', or '2026-12-07/16-35-34' when two end alike)."""
    parts = [p.resolve().parts for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]


def collect_sweeps(sweep_dirs: list[str | Path], force: bool = False) -> Sweep:
    """One sweep folder, or several pooled into one report (`pool_sweeps`)."""
    return pool_sweeps([collect_sweep(path, force=force) for path in sweep_dirs])

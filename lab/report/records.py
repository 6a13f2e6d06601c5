"""Sweep collection: one plain record per job, from a sweep directory or from wandb runs.

A record is a dict with a fixed shape, whatever its source:

    job         int   job number inside the sweep (Hydra's `hydra.job.num`)
    name        str   job directory name (or wandb run name)
    run_dir     str   path relative to the sweep directory ('' for wandb runs)
    overrides   list  the job's Hydra task overrides, e.g. ["head=parallel", "seed=1"]
    status      str   "ok" | "failed" | "interrupted" (stopped by a signal, or run.json still says running
                      and its process is gone) | "running" (its process is alive on this host)
                      | "not started" (in the sweep's plan, no folder: the sweep stopped before it)
    error       str   failure reason, or where an interrupted job stopped (None when ok)
    run_time_s  float wall time of the job (None when unknown)
    head, k, reduction, weights, schedule, seed   from the run record / manifest / config
    head_traits dict  run.json `head_traits` (baseline, teacher_forced, display_rank; None for records written
                      before it: lab/report/head_traits.py reads those by head name)
    final       dict  final metrics {name: float} (empty for a failed job)
    history     dict  {metric: [(step, value), ...]} from metrics.csv / wandb history; a validation metric's step is the
                      optimizer step the validation ran at (`history_step`)
    steps       int   optimizer steps the run trained (run.json's last attempt `step`; None when not recorded)
    parameters  dict  parameter table of the model (may be empty; runs before `cost` existed)
    cost        dict  run.json `cost`: params_total, blocks_trunk / blocks_head / blocks_next_token_path,
                      train_flops_per_token, measured train_tokens_per_s, train_time_s (may be empty)
    corpus      dict  run.json `corpus_stats`: unigram_nats_per_token, top_token_share, ... (may be empty)
    numerics    dict  run.json `numerics`: CPU, ISA flags, kernel capability, library versions, threads, dtype
                      (lab/tracking/numerics.py; empty for runs recorded before it)

The conversion from wandb's public-API run objects is a pure function of plain dicts
(`record_from_wandb`) so it can be tested without a network.
"""

from __future__ import annotations

import csv
import json
import math
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lab.report.atomic import pid_alive

from lab.report.sweep_plan import read_plan

SWEEP_MARKER = "multirun.yaml"  # written by Hydra's sweeper into every sweep directory
FIGURES_DIR = "figures"
NOT_STARTED = "not started"
RECORD_FIELDS = ("head", "k", "reduction", "weights", "schedule", "seed")


class ReportError(Exception):
    """Bad input for the report: one line, names the path or field at fault."""


@dataclass
class Sweep:
    name: str
    source: str  # the sweep directory, or "wandb:ENTITY/PROJECT/GROUP"
    records: list[dict] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)  # the sweep folders pooled into this one (`pool_sweeps`; [] = one)

    @property
    def n_folders(self) -> int:
        return max(1, len(self.folders))

    @property
    def completed(self) -> list[dict]:
        return [r for r in self.records if r["status"] == "ok"]

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.records if r["status"] != "ok"]


# ---- helpers ------------------------------------------------------------------------


def to_float(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number


def finite(value) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


def override_items(overrides: list[str]) -> list[tuple[str, str]]:
    """["head=parallel", "+x=1"] → [("head", "parallel"), ("+x", "1")] (flags without '=' kept whole)."""
    items = []
    for override in overrides:
        key, _, value = str(override).partition("=")
        items.append((key, value))
    return items


VALIDATION_PREFIX = "val/"


def history_step(metric: str, logged: int) -> int:
    """The step a logged value belongs to. Lightning logs training values under the index of their batch (0-based),
    and a validation that runs after batch i (so after i + 1 optimizer steps: `val_check_interval=75` validates at 75,
    150) under that same index i; the report keys a validation by the optimizer step it ran at, i + 1.
    Values logged after fit (decoding, throughput: `trainer.global_step`) already carry the step count."""
    return logged + 1 if metric.startswith(VALIDATION_PREFIX) else logged


def read_history(path: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.csv (CSVLogger: one row per logging call, blank cells elsewhere) → per-metric series."""
    history: dict[str, list[tuple[int, float]]] = {}
    if not path.exists():
        return history
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            step = to_float(row.get("step"))
            if step is None:
                continue
            for name, cell in row.items():
                if name in ("step", "epoch") or cell in (None, ""):
                    continue
                value = to_float(cell)
                if value is not None:
                    history.setdefault(name, []).append((history_step(name, int(step)), value))
    return history


def last_values(history: dict) -> dict[str, float]:
    return {name: series[-1][1] for name, series in history.items() if series}


def empty_record() -> dict:
    return {
        "job": None, "name": "", "run_dir": "", "overrides": [], "status": "failed", "error": None,
        "run_time_s": None, "head": None, "k": None, "head_traits": None, "reduction": None, "weights": None,
        "schedule": None, "seed": None, "drafter_objective": None, "steps": None, "final": {}, "history": {}, "parameters": {}, "cost": {}, "corpus": {}, "numerics": {},
    }


# ---- sweep directories ------------------------------------------------------------------


def is_job_dir(path: Path) -> bool:
    return path.is_dir() and ((path / "run.json").exists() or (path / ".hydra" / "overrides.yaml").exists())


def hydra_job_settings(job_dir: Path) -> dict:
    """The `hydra:` node of a job's .hydra/hydra.yaml ({} when absent or unreadable)."""
    hydra_yaml = job_dir / ".hydra" / "hydra.yaml"
    if not hydra_yaml.exists():
        return {}
    try:
        return (yaml.safe_load(hydra_yaml.read_text()) or {}).get("hydra", {}) or {}
    except yaml.YAMLError:
        return {}


def is_sweep_job(job_dir: Path, sweep_dir: Path) -> bool:
    """A job whose Hydra sweep directory is `sweep_dir` (sweepers other than the basic one, e.g.
    Optuna's, write no multirun.yaml; a job re-run by lab-resume keeps its sweep directory)."""
    swept_into = (hydra_job_settings(job_dir).get("sweep") or {}).get("dir")
    if swept_into is None:
        return False
    parts = Path(swept_into).parts  # relative to the directory lab-train ran in: compare the tail
    return Path(swept_into).resolve() == sweep_dir.resolve() or sweep_dir.resolve().parts[-len(parts):] == parts


def job_number(job_dir: Path) -> int | None:
    hydra_yaml = job_dir / ".hydra" / "hydra.yaml"
    if hydra_yaml.exists():
        try:
            num = (yaml.safe_load(hydra_yaml.read_text()) or {}).get("hydra", {}).get("job", {}).get("num")
            if isinstance(num, int):
                return num
        except yaml.YAMLError:
            pass
    match = re.match(r"(\d+)", job_dir.name)
    return int(match.group(1)) if match else None


def record_from_run_dir(job_dir: Path, sweep_dir: Path) -> dict:
    record = empty_record()
    record["name"] = job_dir.name
    record["run_dir"] = str(job_dir.relative_to(sweep_dir))
    record["job"] = job_number(job_dir)
    record["history"] = read_history(job_dir / "metrics.csv")
    overrides_yaml = job_dir / ".hydra" / "overrides.yaml"
    if overrides_yaml.exists():
        record["overrides"] = [str(o) for o in (yaml.safe_load(overrides_yaml.read_text()) or [])]
    run_json = job_dir / "run.json"
    if not run_json.exists():
        record["error"] = "no run.json: the job was killed or is still running"
        return record
    try:
        payload = json.loads(run_json.read_text())
    except json.JSONDecodeError as error:
        record["error"] = f"unreadable run.json: {error}"
        return record
    record["overrides"] = [str(o) for o in payload.get("overrides") or record["overrides"]]
    record["status"] = payload.get("status") if payload.get("status") in ("ok", "interrupted") else "failed"
    record["error"] = payload.get("error") or (None if record["status"] == "ok" else f"status {payload.get('status')!r}")
    if payload.get("status") == "running":
        record["status"], record["error"] = running_status(payload, record["history"])
    record["run_time_s"] = to_float(payload.get("run_time_s"))
    record["final"] = {name: float(value) for name, value in (payload.get("final_metrics") or {}).items() if to_float(value) is not None}
    record["parameters"] = payload.get("parameters") or {}
    record["cost"] = payload.get("cost") or {}
    record["corpus"] = payload.get("corpus_stats") or {}
    record["numerics"] = payload.get("numerics") or {}
    attempts = [a for a in payload.get("attempts") or [] if isinstance(a, dict)]
    record["steps"] = attempts[-1].get("step") if attempts and isinstance(attempts[-1].get("step"), int) else None
    manifest = payload.get("manifest") or {}
    config = payload.get("config") or {}
    record.update(fields_from(payload, manifest, config))
    return record


def process_alive(pid, host) -> bool:
    """Whether `pid` still runs (only knowable on its own host; a pid reused since is taken as alive)."""
    return host == socket.gethostname() and isinstance(pid, int) and pid_alive(pid)


def running_status(payload: dict, history: dict) -> tuple[str, str]:
    """(status, reason) of a job whose run.json says running: alive, or interrupted (killed) with its last step."""
    steps = [series[-1][0] for series in history.values() if series]
    last = f"last logged step {max(steps)}" if steps else "no step logged"
    where = f"pid {payload.get('pid')} on {payload.get('host')}"
    if process_alive(payload.get("pid"), payload.get("host")):
        return "running", f"still running ({where}); {last}"
    return "interrupted", f"interrupted ({where} is gone); {last}"


def fields_from(recorded: dict, manifest: dict, config: dict) -> dict:
    """head, K, head traits, policy, weight schedule, backward schedule, seed from what the run recorded (run.json,
    or the wandb run config), its manifest and/or its resolved config."""
    head = config.get("head") or {}
    weights = manifest.get("weights") or config.get("weights") or {}
    k = recorded_k(recorded, manifest, head)
    return {
        "head": manifest.get("head") or head.get("name"),
        "k": int(k) if k is not None else None,
        "head_traits": recorded.get("head_traits"),
        "reduction": manifest.get("reduction") or (config.get("reduction") or {}).get("policy"),
        "weights": weights.get("name") if isinstance(weights, dict) else weights,
        "schedule": manifest.get("schedule") or (config.get("schedule") or {}).get("name"),
        "seed": config.get("seed"),
        "drafter_objective": drafter_objective(manifest.get("target") or config.get("objective") or {},
                                               manifest.get("head_config") or head),
    }


def drafter_objective(target: dict, head: dict) -> str:
    """What the draft horizons learned from: `target[+ce share], truncation, rollout` (lab/objective/targets.py,
    readings.py; a chain's head.rollout)."""
    name = target.get("target") or "data"
    if name == "mix":
        name += f" α={target.get('mix_alpha', 0.5)}"
    elif target.get("ce_share"):
        name += f" + {target['ce_share']}·CE"
    rollout = "teacher"
    if head.get("rollout") == "self":
        rollout = f"self s={head.get('rollout_steps')} {head.get('rollout_tokens', 'drafted')}"
    return f"{name}, truncate {target.get('truncate') or 'none'}, rollout {rollout}"


def recorded_k(recorded: dict, manifest: dict, head: dict) -> int | None:
    """The run's K as lab-train recorded it (`k`: head.k resolved); a record written before that field: the manifest's
    or the config's head.k, or for a DeepSeek config that gave only its depth D, K = D + 1 (that head's rule)."""
    k = next((value for value in (recorded.get("k"), manifest.get("k"), head.get("k")) if value is not None), None)
    if k is None and head.get("depth") is not None:
        return head["depth"] + 1
    return k


def collect_sweep(sweep_dir: str | Path, force: bool = False) -> Sweep:
    """Every job directory of a Hydra sweep directory, sorted by job number.

    A folder without Hydra's `multirun.yaml` (e.g. `outputs/<date>/`, a collection of unrelated
    single runs) is refused: its "sweep dimensions" would be whatever happens to differ between
    the runs. `force=True` reports on such a folder anyway.
    """
    root = Path(sweep_dir)
    if not root.is_dir():
        raise ReportError(f"{sweep_dir}: no such directory")
    jobs = sorted((p for p in root.iterdir() if is_job_dir(p)), key=lambda p: p.name)
    if not (root / SWEEP_MARKER).exists() and not (jobs and all(is_sweep_job(job, root) for job in jobs)):
        if not jobs:
            raise ReportError(f"{sweep_dir}: not a sweep directory (no {SWEEP_MARKER} and no job directories with run.json)")
        if not force:
            raise ReportError(f"{sweep_dir}: not a sweep directory (no {SWEEP_MARKER}; its {len(jobs)} run folder(s) are "
                              "separate runs, not one sweep): pass --force to report on them anyway")
    records = [record_from_run_dir(job, root) for job in jobs]
    started = {record["job"] for record in records}
    records += [not_started_record(job) for job in read_plan(root) if job["num"] not in started]
    records.sort(key=lambda r: (r["job"] if r["job"] is not None else 1 << 30, r["name"]))
    return Sweep(name=sweep_name_of(root, records), source=str(root), records=records)


def not_started_record(job: dict) -> dict:
    """A planned job (lab/report/sweep_plan.py) that has no folder: the sweep stopped before it."""
    return {**empty_record(), "job": job["num"], "name": f"job {job['num']}", "overrides": list(job["overrides"]),
            "status": NOT_STARTED, "error": "not started: the sweep stopped before this job (lab-resume runs it)"}


def sweep_name_of(root: Path, records: list[dict]) -> str:
    for record in records:
        run_json = root / record["run_dir"] / "run.json"
        if run_json.exists():
            try:
                name = (json.loads(run_json.read_text()).get("config") or {}).get("sweep_name")
            except json.JSONDecodeError:
                continue
            if name:
                return str(name)
    return root.name


# ---- wandb runs (pure conversion) ---------------------------------------------------------

FAILED_STATES = ("failed", "crashed", "killed")


def record_from_wandb(run: dict, job: int) -> dict:
    """One wandb run, as plain data, → a record.

    `run` holds what the public API gives: id, name, state, job_type, group, config (the
    logged hyperparameters, plus `overrides` and `run_time_s` when the job logged them),
    summary (last values; `status` / `error` when the job logged them) and history (a
    list of row dicts with `_step` / `trainer/global_step`).
    """
    record = empty_record()
    config = dict(run.get("config") or {})
    summary = dict(run.get("summary") or {})
    record["job"] = job
    record["name"] = str(run.get("name") or run.get("id") or f"run{job}")
    manifest = config.get("manifest") or {}
    record.update(fields_from(config, manifest, config))
    record["cost"] = dict(config.get("cost") or {})  # logged as a hyperparameter by lab-train
    record["corpus"] = dict(config.get("corpus_stats") or {})  # likewise
    record["numerics"] = dict(config.get("numerics") or {})  # likewise
    overrides = config.get("overrides")
    record["overrides"] = [str(o) for o in overrides] if overrides else synthesized_overrides(record)
    status = summary.get("status")
    state = str(run.get("state") or "")
    if status in ("ok", "failed"):
        record["status"] = status
    else:
        record["status"] = "failed" if state in FAILED_STATES else "ok"
    if record["status"] == "failed":
        record["error"] = str(summary.get("error") or f"wandb run state '{state or 'unknown'}'")
    record["run_time_s"] = to_float(summary.get("run_time_s", summary.get("_runtime")))
    history: dict[str, list[tuple[int, float]]] = {}
    for row in run.get("history") or []:
        step = to_float(row.get("trainer/global_step", row.get("_step")))
        if step is None:
            continue
        for name, value in row.items():
            if name.startswith("_") or name in ("trainer/global_step", "epoch"):
                continue
            number = to_float(value)
            if number is not None:
                history.setdefault(name, []).append((history_step(name, int(step)), number))
    record["history"] = history
    if record["status"] == "ok":
        final = {name: float(v) for name, v in summary.items() if not name.startswith("_") and to_float(v) is not None}
        final.update({name: v for name, v in last_values(history).items() if name not in final})
        record["final"] = {name: value for name, value in final.items() if "/" in name}
    return record


def synthesized_overrides(record: dict) -> list[str]:
    """For runs that did not log their overrides: the manifest fields as override strings."""
    out = []
    for key, name in (("head", "head"), ("k", "head.k"), ("reduction", "reduction"), ("weights", "weights"), ("schedule", "schedule"), ("seed", "seed")):
        if record.get(key) is not None:
            out.append(f"{name}={record[key]}")
    return out


def sweep_job_number(run: dict) -> float:
    """The job's number in its sweep, from its logged run_dir (`<sweep>/3-head:parallel+k:4`); jobs side by side start in
    any order, so creation time does not give it (inf when the run logged no such folder)."""
    found = re.match(r"(\d+)-", Path(str((run.get("config") or {}).get("run_dir") or "")).name)
    return int(found.group(1)) if found else math.inf


def sweep_from_wandb_runs(runs: list[dict], source: str, name: str) -> Sweep:
    """Plain wandb runs of one group → a Sweep; the report run itself (job_type 'report') is left out."""
    jobs = [run for run in runs if run.get("job_type") != "report"]
    jobs.sort(key=lambda run: (sweep_job_number(run), str(run.get("created_at") or ""), str(run.get("name") or ""), str(run.get("id") or "")))
    return Sweep(name=name, source=source, records=[record_from_wandb(run, index) for index, run in enumerate(jobs)])

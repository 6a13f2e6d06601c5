"""A sweep's wandb runs read from their local run files, as the plain dicts the public API gives.

Every wandb run, offline or online, leaves a `run-<id>.wandb` transaction log in its run
directory; wandb's own reader (`wandb leet inspect --json`) prints its records. The plain
dict has the keys of `lab.report.wandb_source.plain_run` (id, name, state, group, job_type,
created_at, config, summary, history), so `lab.report.records.sweep_from_wandb_runs` turns it
into records exactly as it does for runs fetched over the network.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab.report.records import ReportError

EXIT_OK = 0
READERS = 8  # reader processes at once: each mostly waits on its own start-up


def run_files(root: str | Path) -> list[Path]:
    """Every `run-*.wandb` under root (job dirs or the sweep's own wandb dir), each file once."""
    seen: dict[Path, Path] = {}
    for path in sorted(Path(root).rglob("run-*.wandb")):
        seen.setdefault(path.resolve(), path)  # `latest-run` links to a run dir listed too
    return sorted(seen.values())


def inspect_records(path: Path) -> list[dict]:
    # this interpreter's wandb, whatever PATH says
    result = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                            capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise ReportError(f"{path}: wandb leet inspect failed: {(result.stderr.strip().splitlines() or ['no output'])[-1]}")
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def update(target: dict, change: dict) -> None:
    """A record's `update` is a partial nested dict; later records win, key by key."""
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            update(target[key], value)
        else:
            target[key] = value


def plain_run_from_file(path: str | Path) -> dict:
    """One local wandb run (a `.wandb` file or its run directory) → the plain dict of the public API."""
    run: dict = {}
    config: dict = {}
    summary: dict = {}
    history: list[dict] = []
    exit_code = None
    for record in inspect_records(Path(path)):
        kind = record.get("type")
        if kind == "run":
            run = record["run"]
            update(config, (run.get("config") or {}).get("update") or {})
        elif kind == "config":
            update(config, record["config"].get("update") or {})
        elif kind == "summary":
            change = dict(record["summary"].get("update") or {})
            runtime = max(summary.get("_runtime") or 0, change.get("_runtime") or 0)  # a closing update resets it to 0
            update(summary, change)
            summary["_runtime"] = runtime
        elif kind == "history":
            history.append(dict(record["history"].get("item") or {}))
        elif kind == "exit":
            exit_code = record["exit"].get("exit_code", EXIT_OK)
    if not run:
        raise ReportError(f"{path}: no run record in this wandb file")
    state = "running" if exit_code is None else ("finished" if exit_code == EXIT_OK else "failed")
    return {
        "id": run.get("run_id"),
        "name": run.get("display_name") or run.get("run_id"),
        "state": state,
        "group": run.get("run_group"),
        "job_type": run.get("job_type"),
        "created_at": run.get("start_time") or "",
        "config": {key: value for key, value in config.items() if not key.startswith("_")},
        "summary": {key: value for key, value in summary.items() if not key.startswith("_") or key == "_runtime"},
        "history": history,
    }


def local_runs(root: str | Path, group: str | None = None) -> list[dict]:
    """The plain runs under a sweep directory (all of them, or those of one wandb group)."""
    with ThreadPoolExecutor(max_workers=READERS) as pool:
        runs = list(pool.map(plain_run_from_file, run_files(root)))
    return [run for run in runs if group is None or run["group"] == group]

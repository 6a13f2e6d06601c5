"""Fetch a sweep's runs from wandb's public API as plain dicts (for `lab-report --wandb`).

Only `fetch_runs` talks to the network; `lab.report.records.sweep_from_wandb_runs` turns
its output into the same records a sweep directory gives, and is tested offline.
"""

from __future__ import annotations

from lab.report.records import ReportError, Sweep, sweep_from_wandb_runs


def plain_run(run, history_samples: int = 2000) -> dict:
    """A `wandb.apis.public.Run` → the plain dict `record_from_wandb` reads."""
    history = [dict(row) for row in run.scan_history(page_size=1000)] if history_samples is None else \
        [dict(row) for row in run.history(samples=history_samples, pandas=False)]
    return {
        "id": run.id,
        "name": run.name,
        "state": run.state,
        "group": run.group,
        "job_type": run.job_type,
        "created_at": str(getattr(run, "created_at", "") or ""),
        "config": {key: value for key, value in dict(run.config).items() if not key.startswith("_")},
        "summary": {key: value for key, value in dict(run.summary).items() if not str(key).startswith("_") or key == "_runtime"},
        "history": history,
    }


def fetch_runs(path: str, group: str) -> list[dict]:
    if path.count("/") != 1 or not all(path.split("/")):
        raise ReportError(f"--wandb: expected ENTITY/PROJECT, got '{path}'")
    try:
        import wandb

        api = wandb.Api()
        runs = api.runs(path, filters={"group": group})
        return [plain_run(run) for run in runs]
    except ReportError:
        raise
    except Exception as error:  # network, auth, unknown project
        raise ReportError(f"--wandb {path} --group {group}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")


def sweep_from_wandb(path: str, group: str) -> Sweep:
    runs = fetch_runs(path, group)
    if not runs:
        raise ReportError(f"--wandb {path} --group {group}: no runs in this group")
    return sweep_from_wandb_runs(runs, source=f"wandb:{path}/{group}", name=group)

"""run.json: status, error, final metrics and the manifest of one job, written atomically."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "pytorch-lightning", "hydra-core", "wandb", "datasets", "tokenizers", "mtp-lab")


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parent.parent
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def is_global_rank_zero() -> bool:
    """Rank from the launcher's environment (Lightning sets RANK / LOCAL_RANK for its workers)."""
    return all(int(os.environ.get(name, 0)) == 0 for name in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def write_json_atomic(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)


def scalar_metrics(metrics: dict) -> dict:
    out = {}
    for name, value in metrics.items():
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            continue
    return out


class RunRecord:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "run.json"
        self.started = time.time()
        self.payload: dict = {"status": "running", "error": None, "started_at": self.started}

    def update(self, **fields) -> None:
        self.payload.update(fields)

    def finish(self, status: str, error: str | None = None, metrics: dict | None = None) -> None:
        if not is_global_rank_zero():
            return  # under DDP every rank runs the job; only rank 0 owns run.json
        self.payload.update(
            status=status,
            error=error,
            final_metrics=scalar_metrics(metrics or {}),
            run_time_s=time.time() - self.started,
            versions=package_versions(),
            git_commit=git_commit(),
        )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, self.payload)

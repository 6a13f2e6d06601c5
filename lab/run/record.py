"""run.json: the record of one run directory, kept across every attempt, written atomically.

A run directory can see several attempts: the first start, resumes after a kill, resumes
refused because the checkpoint belongs to another experiment, a resume of a run that has
nothing left to do. `run.json` holds the run's current state (status, error, final metrics,
manifest, overrides of the first attempt) plus an `attempts` list with one entry per attempt
(start, end, status, error, overrides, checkpoint step resumed from, pid, host, its own final
metrics). An attempt never erases what an earlier one recorded:

- a refused attempt (bad config or checkpoint) only appends its entry;
- a finished run resumed with nothing to do only appends its entry;
- an accepted attempt marks itself `running` (with pid and host) before training starts,
  so a killed attempt stays `running` on disk and the next attempt (or `lab-report`) knows
  it was interrupted; `run_time_s` is the sum over the attempts that trained.

Under DDP every rank runs the job; only global rank 0 writes run.json.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

from lab.checkpoint.manifest import package_versions

# Attempt statuses. `running` on disk after the process is gone means it was killed.
RUNNING, OK, FAILED, INTERRUPTED, REFUSED, NOTHING_TO_DO = "running", "ok", "failed", "interrupted", "refused", "nothing_to_do"
TRAINED = (RUNNING, OK, FAILED, INTERRUPTED)  # attempts whose wall time counts towards run_time_s
HEARTBEAT_S = 10.0  # a killed attempt's run time is known up to its last heartbeat


def git_commit() -> str | None:
    try:
        root = Path(__file__).resolve().parents[2]  # the project checkout
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


def read_run_json(path: Path) -> dict | None:
    """The previous attempts' record, or None when there is none (an unreadable one is kept aside, never lost)."""
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text())
        if isinstance(payload, dict):
            return payload
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        pass
    if is_global_rank_zero():
        os.replace(path, path.with_name(f"{path.name}.unreadable-{int(time.time())}"))
    return None


def attempt_time(attempt: dict) -> float:
    end = attempt.get("ended_at") or attempt.get("heartbeat_at") or attempt.get("started_at")
    return max(0.0, float(end) - float(attempt.get("started_at") or end))


class RunRecord:
    """run.json of one run directory; one instance per attempt (process)."""

    def __init__(self, run_dir: Path, overrides: list[str]):
        self.path = Path(run_dir) / "run.json"
        self.previous = read_run_json(self.path)
        attempts = list((self.previous or {}).get("attempts") or [])
        if self.previous is not None and not attempts:  # a record written before attempts were kept
            attempts.append(legacy_attempt(self.previous))
        self.attempts = attempts
        self.attempt = {
            "attempt": len(attempts) + 1, "started_at": time.time(), "ended_at": None, "status": RUNNING, "error": None,
            "overrides": list(overrides), "resumed_from_step": None, "resumed_from": None,
            "pid": os.getpid(), "host": socket.gethostname(),
        }
        self.fields: dict = {}  # this attempt's config, manifest, parameters, corpus stats
        self._last_heartbeat = 0.0

    @property
    def started(self) -> float:
        """When this attempt started (time.time())."""
        return self.attempt["started_at"]

    @property
    def finished_ok(self) -> bool:
        return (self.previous or {}).get("status") == OK

    def update(self, **fields) -> None:
        self.fields.update(fields)

    # ---- outcomes that leave the run's state alone ----------------------------------------------

    def refuse(self, reason: str) -> None:
        """A refused attempt: appended to an existing record; a fresh run dir gets a failed record."""
        self._close(REFUSED, reason)
        if self.previous is None:
            self._write(self._run_state(status=FAILED, error=reason, final_metrics={}))
            return
        self._write({**self.previous, "attempts": [*self.attempts, self.attempt]})

    def nothing_to_do(self, message: str) -> None:
        self._close(NOTHING_TO_DO, None)
        self.attempt["note"] = message
        self._write({**self.previous, "attempts": [*self.attempts, self.attempt]})

    # ---- an accepted attempt --------------------------------------------------------------------

    def start(self, resumed_from: str | None, resumed_from_step: int | None, fresh: bool = False) -> None:
        """Before training: this attempt is `running`; an earlier attempt left `running` was killed.

        `fresh`: a start from step 0 without ckpt_path in a folder an unfinished run left: this attempt's
        overrides define the run from now on (the earlier attempts stay listed)."""
        if fresh and self.previous is not None:
            self.previous = {**self.previous, "overrides": self.attempt["overrides"]}
        for attempt in self.attempts:
            if attempt.get("status") == RUNNING:
                attempt.update(status=INTERRUPTED, ended_at=attempt.get("heartbeat_at") or attempt.get("started_at"))
        self.attempt.update(resumed_from=resumed_from, resumed_from_step=resumed_from_step)
        self._write(self._run_state(status=RUNNING, error=None, final_metrics={}))

    def heartbeat(self, step: int, force: bool = False) -> None:
        """While training: the last step reached, so a killed attempt's run time and progress are known."""
        now = time.time()
        if not force and now - self._last_heartbeat < HEARTBEAT_S:
            return
        self._last_heartbeat = now
        self.attempt.update(heartbeat_at=now, step=int(step))
        self._write(self._run_state(status=RUNNING, error=None, final_metrics={}))

    def finish(self, status: str, error: str | None = None, metrics: dict | None = None, step: int | None = None) -> None:
        final = scalar_metrics(metrics or {}) if status == OK else {}
        self._close(status, error)
        if step is not None:
            self.attempt["step"] = int(step)  # the step the attempt reached (the heartbeat's may be up to HEARTBEAT_S old)
        self.attempt["final_metrics"] = final
        self._write(self._run_state(status=status, error=error, final_metrics=final))

    # ---- internals ------------------------------------------------------------------------------

    def _close(self, status: str, error: str | None) -> None:
        self.attempt.update(status=status, error=error, ended_at=time.time())

    def _run_state(self, *, status: str, error: str | None, final_metrics: dict) -> dict:
        """The run's state after this attempt; overrides stay the first attempt's (the run's definition)."""
        previous = self.previous or {}
        attempts = [*self.attempts, self.attempt]
        return {
            **previous,
            "config": previous.get("config"),
            **self.fields,
            "overrides": previous.get("overrides", self.attempt["overrides"]),
            "status": status,
            "error": error,
            "final_metrics": final_metrics,
            "started_at": previous.get("started_at", self.attempt["started_at"]),
            "run_time_s": sum(attempt_time(a) for a in attempts if a.get("status") in TRAINED),
            "attempts": attempts,
            "pid": self.attempt["pid"],
            "host": self.attempt["host"],
            "versions": package_versions(),
            "git_commit": git_commit(),
        }

    def _write(self, payload: dict) -> None:
        if not is_global_rank_zero():
            return  # under DDP every rank runs the job; only rank 0 owns run.json
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, payload)


def legacy_attempt(payload: dict) -> dict:
    """An attempt entry for a run.json written before attempts were recorded."""
    started = payload.get("started_at")
    ended = None if started is None or payload.get("run_time_s") is None else started + payload["run_time_s"]
    return {
        "attempt": 1, "started_at": started, "ended_at": ended, "status": payload.get("status"), "error": payload.get("error"),
        "overrides": payload.get("overrides") or [], "resumed_from_step": None, "resumed_from": None,
        "final_metrics": payload.get("final_metrics") or {},
    }

"""One attempt of `lab-train` on a run directory: accept it, clean up after a killed one, close it.

lab/train.py calls these in order: every check (`prepare`), then `nothing_left` (a finished
run resumed with nothing to do changes nothing), then `begin_attempt` (run.json says
`running`, orphaned temp files of a killed attempt are removed), then fit, then
`close_attempt` on failure. A failure before `begin_attempt` is a refused attempt: run.json
keeps the run's state and only gains the attempt's entry.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lab.errors import ConfigError
from lab.checkpoint.files import orphaned_partials, orphaned_staged
from lab.run.guard import cause, fault_reason
from lab.run.record import RunRecord, is_global_rank_zero


def checkpoint_dir(cfg: DictConfig, run_dir: Path) -> Path:
    dirpath = OmegaConf.select(cfg, "callbacks.checkpoint.dirpath")
    return Path(dirpath) if dirpath else run_dir / "checkpoints"


def nothing_left(cfg: DictConfig, record: RunRecord, resume_step: int | None) -> str | None:
    """Why this attempt has nothing to do (a finished run resumed at or past trainer.max_steps), else None."""
    max_steps = int(cfg.trainer.max_steps)
    if resume_step is None or not record.finished_ok or max_steps < 0 or resume_step < max_steps:
        return None
    return f"the run finished at step {resume_step} (trainer.max_steps={max_steps}); its records are unchanged"


def begin_attempt(record: RunRecord, cfg: DictConfig, run_dir: Path, ckpt_path: str | None, resume_step: int | None) -> dict:
    """The attempt is accepted: run.json says `running` (pid, host); a killed attempt's temp files go."""
    record.start(ckpt_path, resume_step, fresh=cfg.ckpt_path is None)
    if is_global_rank_zero():
        for orphan in [*orphaned_partials(checkpoint_dir(cfg, run_dir)), *orphaned_staged(checkpoint_dir(cfg, run_dir))]:
            orphan.unlink(missing_ok=True)
    return record.attempt


def close_attempt(record: RunRecord, attempt: dict | None, status: str, reason: str, step: int | None = None) -> str:
    """Record a refused (attempt None), failed or interrupted attempt (with the step it reached);
    '' or a note when run.json itself cannot be written."""
    try:
        if attempt is None:
            record.refuse(reason)
        else:
            record.finish(status, reason, step=step)
    except OSError as error:
        return f" (run.json not updated: {cause(error)})"
    return ""


def failure_reason(error: Exception, cfg: DictConfig, run_dir: Path) -> str:
    if isinstance(error, ConfigError):
        return f"config error: {error}"
    if isinstance(error, OSError):
        return fault_reason(error, cfg, run_dir)
    return f"{type(error).__name__}: {error}"


def final_value(metrics: dict) -> float | None:
    """The job's return value for Hydra sweepers: the final validation loss."""
    value = metrics.get("val/loss")
    return None if value is None else float(value)

"""Closing a job's wandb run (if one is open) with its final status."""

from __future__ import annotations


def mark_wandb_run_failed(reason: str) -> None:
    """Called by a failing job before it closes its wandb run: `status`/`error` in the run summary
    (what `lab.report.records.record_from_wandb` reads) and a non-zero exit code, so the run
    shows as failed in wandb."""
    try:
        import wandb

        if wandb.run is not None:
            wandb.run.summary.update({"status": "failed", "error": reason})
            wandb.finish(exit_code=1)
    except Exception:  # a logger failure must not hide the job's own error
        pass


def finish_wandb() -> None:
    try:
        import wandb

        if wandb.run is not None:
            wandb.finish()
    except Exception:  # a logger failure must not hide the job's own error
        pass

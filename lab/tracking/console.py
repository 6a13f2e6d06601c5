"""What `lab-train` prints: known library noise silenced, nothing else.

Only the exact lines below are hidden; every other warning still reaches the console, in
particular those about the user's own settings. Each entry says why it is noise here.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings

# (regex on the message, why it is noise in this harness)
NOISY_WARNINGS = (
    (r".*`isinstance\(treespec, LeafSpec\)` is deprecated.*",
     "Lightning's own use of a torch pytree API; nothing a user can change"),
    (r".*ModelCheckpoint with manual optimization.*",
     "checkpoints are written after the optimizer step on purpose: resume continues from there"),
    (r".*ended before the epoch ended and your dataloader is not resumable.*",
     "the training sampler resumes mid-epoch by the restored step (lab/data/sampler.py)"),
    (r".*module\(s\) in eval mode at the start of training.*",
     "a frozen pretrained trunk runs in eval mode on purpose (no dropout; head.trunk_grad=frozen|lora)"),
)
NOISY_LOG_LINES = (
    (r"^💡 Tip: For seamless cloud logging.*litlogger",
     "an advertisement printed by every Trainer"),
    (r"^(GPU available: False|TPU available: False|HPU available: False)",
     "every Trainer of every sweep job says the devices it lacks; the run's device is in run.json and the threads line"),
)
# (logger, regex on the message, why) for library loggers other than Lightning's.
NOISY_LIBRARY_LINES = (
    ("datasets.packaged_modules.json.json", r"^Failed to load JSON from file",
     "a second, vaguer copy of the error lab/data/diagnose.py names in one line (line N is not JSON)"),
    ("datasets.packaged_modules.parquet.parquet", r"^Failed to read schema from",
     "a copy of the error the data.path line already gives (lab/data/local_files.py: cannot read as parquet)"),
)
# The CSV logger warns that a non-empty log directory's files "will be deleted". The run dir
# always holds Hydra's .hydra/ before the logger starts, so on a fresh run (no metrics.csv yet)
# the warning is noise; when a metrics.csv from an earlier run is there it stays visible (see
# `quiet_csv_overwrite`).
CSV_DIR_NOT_EMPTY = r".*Experiment logs directory .* exists and is not empty.*"


class DropMatching(logging.Filter):
    def __init__(self, patterns: list[str]):
        super().__init__()
        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in self.patterns)


def quiet_known_noise() -> None:
    """Install the filters (idempotent): warnings by message, Lightning's info lines by logger."""
    for pattern, _why in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name in ("pytorch_lightning.utilities.rank_zero", "lightning.pytorch.utilities.rank_zero"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMatching) for f in logger.filters):
            logger.addFilter(DropMatching([p for p, _ in NOISY_LOG_LINES]))
    for name, pattern, _why in NOISY_LIBRARY_LINES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMatching) for f in logger.filters):
            logger.addFilter(DropMatching([pattern]))


@contextlib.contextmanager
def quiet_csv_overwrite(previous_metrics_exist: bool, resuming: bool):
    """Inside: the CSV logger's 'will be deleted' warning is hidden unless it would delete an
    earlier run's log. On resume the earlier rows are kept by lab/tracking/csv_history.py, so the
    warning is wrong there too."""
    with warnings.catch_warnings():
        if resuming or not previous_metrics_exist:
            warnings.filterwarnings("ignore", message=CSV_DIR_NOT_EMPTY)
        yield


def duration(seconds: float) -> str:
    """83.4 → '1m 23s'; 7.2 → '7.2s'; 3725 → '1h 02m 05s'."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def current_wandb_run() -> dict | None:
    """id, offline run folder and mode of the active wandb run (None when there is none)."""
    import sys

    wandb = sys.modules.get("wandb")  # never import wandb just to ask
    run = getattr(wandb, "run", None) if wandb is not None else None
    if run is None:
        return None
    from pathlib import Path

    return {"id": run.id, "dir": str(Path(run.dir).parent), "offline": bool(run.offline)}


def summary_line(run_dir, metrics: dict, steps: int, seconds: float, wandb_run: dict | None) -> str:
    """The run's last console line: where it is, what it reached, how long it took, how to sync it."""
    parts = [f"done: {run_dir}"]
    loss, bpb = metrics.get("val/loss"), metrics.get("val/bpb")
    if loss is not None:
        parts.append(f"val/loss {float(loss):.4f}" + (f" ({float(bpb):.3f} bits/byte)" if bpb is not None else ""))
    else:
        parts.append("no validation metric")
    parts += [f"{steps} steps", duration(seconds)]
    if wandb_run is not None:
        sync = f"; sync: wandb sync {wandb_run['dir']}" if wandb_run["offline"] else ""
        parts.append(f"wandb run {wandb_run['id']}{sync}")
    return " | ".join(parts)

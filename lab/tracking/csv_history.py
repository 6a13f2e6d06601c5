"""Resumed runs keep their metrics.csv rows from before the checkpoint."""

from __future__ import annotations

import csv
from pathlib import Path


def keep_csv_history(loggers: list, resume_step: int) -> None:
    """CSVLogger deletes metrics.csv when it starts; a resumed run keeps the rows logged before its checkpoint."""
    from lightning_fabric.utilities.rank_zero import rank_zero_only
    from pytorch_lightning.loggers import CSVLogger

    for logger in loggers:
        path = Path(logger.log_dir) / "metrics.csv" if isinstance(logger, CSVLogger) else None
        if path is None or rank_zero_only.rank != 0 or not path.is_file():
            continue
        with path.open(newline="") as file:
            reader = csv.DictReader(file)
            keys = sorted(reader.fieldnames or [])
            rows = [row for row in reader if row.get("step", "").isdigit() and int(row["step"]) < resume_step]
        writer = logger.experiment  # creating the writer removes the old file
        with path.open("w", newline="") as file:
            out = csv.DictWriter(file, fieldnames=keys)
            out.writeheader()
            out.writerows(rows)
        writer.metrics_keys = keys  # its next save appends (or rewrites with a wider header)

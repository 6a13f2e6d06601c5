"""Logical size of the V-wide logits alive at once under each backward schedule.

This is the bookkeeping number logged as `mem/logits_live_bytes`: rows of logits
alive at the peak × vocabulary × bytes per element (docs/api.md, docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from lab.objective.backward import check_schedule

# Rows of logits alive at the peak, given the per-horizon row counts and chunk size.
LiveRowsFn = Callable[[list[int], "int | None"], int]


def _joint_rows(counts: list[int], chunk_rows: int | None) -> int:
    # Every horizon's logits stay alive until the single backward.
    return sum(counts)


def _sequential_rows(counts: list[int], chunk_rows: int | None) -> int:
    # One horizon at a time: its logits are freed before the next is built.
    return max(counts, default=0)


def _chunked_rows(counts: list[int], chunk_rows: int | None) -> int:
    # Sequential, and within a horizon only one chunk of rows is projected at once.
    return min(chunk_rows, max(counts, default=0))


LIVE_ROWS: dict[str, LiveRowsFn] = {
    "joint": _joint_rows,
    "sequential": _sequential_rows,
    "chunked": _chunked_rows,
}


def logit_bytes(
    counts: Sequence[int] | Tensor,
    vocab_size: int,
    *,
    schedule: str,
    bytes_per_element: int = 4,
    chunk_rows: int | None = None,
) -> int:
    """Peak bytes of live logits: b · V · (rows alive at once under `schedule`)."""
    check_schedule(schedule, chunk_rows)
    rows = [int(c) for c in (counts.tolist() if isinstance(counts, Tensor) else counts)]
    return bytes_per_element * vocab_size * LIVE_ROWS[schedule](rows, chunk_rows)

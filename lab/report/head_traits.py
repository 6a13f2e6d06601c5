"""What a report knows of a run's head: the traits its run.json recorded (`head_traits`).

lab-train writes into every run.json whether the head is the next-token baseline, whether its
horizon k ≥ 2 metrics are teacher-forced, and the head's place in tables and figures
(docs/runs-and-reports.md). The report reads them from the record, so it never imports the model.

A record written before run.json carried them is read with the traits its head had then
(`TRAITS_BEFORE_RECORDING`: the heads that existed, in the order they were listed), so reports of
older runs render as they did; a head neither recorded nor listed there is no baseline, not
teacher-forced, and listed after every known head.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HeadTraits:
    baseline: bool = False  # the next-token baseline other variants are compared with
    teacher_forced: bool = False  # its horizon k ≥ 2 metrics saw the true earlier tokens (docs/metrics.md)
    display_rank: int = 0  # its place in tables and figures (then K)


# Runs recorded before `head_traits` existed: each head of that time with the traits it had then.
TRAITS_BEFORE_RECORDING = {
    "ntp": HeadTraits(baseline=True, display_rank=0),
    "linear": HeadTraits(display_rank=1),
    "parallel": HeadTraits(display_rank=2),
    "causal": HeadTraits(display_rank=3),
    "anticausal": HeadTraits(display_rank=4),
    "deepseek": HeadTraits(teacher_forced=True, display_rank=5),
    "identity": HeadTraits(display_rank=6),
    "medusa": HeadTraits(display_rank=7),
}
UNKNOWN = HeadTraits(display_rank=len(TRAITS_BEFORE_RECORDING))  # after every head listed above


def traits_of(record: dict) -> HeadTraits:
    """The head traits `record` carries (run.json `head_traits`, or the wandb run config's); older records: by head name."""
    recorded = record.get("head_traits")
    if isinstance(recorded, dict):
        return HeadTraits(baseline=bool(recorded.get("baseline")), teacher_forced=bool(recorded.get("teacher_forced")),
                          display_rank=int(recorded.get("display_rank", UNKNOWN.display_rank)))
    return TRAITS_BEFORE_RECORDING.get(record.get("head"), UNKNOWN)

"""Grids across head families: Hydra's basic sweeper, with each job's `head.k` read by the head's own K rule.

`lab-train -m head=ntp,parallel,deepseek head.k=2,4 seed=0,1` is the grid every MTP paper runs, but
ntp predicts one horizon and DeepSeek's K is its depth + 1, so half of its jobs were refused. Here each
job's `head.k` goes through the head spec's `options_at` (lab/model/heads/spec.py): a head that fixes K
(ntp) drops the override, a head that derives fields from K (deepseek: head.depth = K − 1) gets them,
and jobs that become identical run once. Every mapping and dropped duplicate is one console line, and
the jobs that will run are listed before the first one trains.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

from lab.report.sweep_plan import write_plan
from lab.run.job_folder import job_settings


def key_of(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def map_job(overrides: list[str]) -> tuple[list[str], str | None]:
    """(the job's overrides under its head's K rule, a note saying what changed or None)."""
    from lab.model.heads import HEAD_SPECS

    values = {key_of(o): o.partition("=")[2] for o in overrides}
    head, k = values.get("head"), values.get("head.k", "")
    if head not in HEAD_SPECS or not k.isdigit():
        return overrides, None
    spec = HEAD_SPECS[head]
    options = spec.options_at(int(k))
    mapped = [o for o in overrides if key_of(o) != "head.k" or spec.example_k is None]
    derived = [f"head.{field}={value}" for field, value in options.items() if field != "k" and f"head.{field}" not in values]
    mapped += derived
    if mapped == overrides:
        return overrides, None
    changes = ([f"head.k={k} dropped ({head} fixes K = {options['k']})"] if spec.example_k is not None else []) + \
              [f"+ {d} (from head.k={k})" for d in derived]
    return mapped, f"{' '.join(overrides)}: " + "; ".join(changes)


def map_grid(jobs: list[list[str]]) -> tuple[list[list[str]], list[str]]:
    """Every job mapped by `map_job`, duplicates after mapping dropped: (jobs to run, console notes)."""
    kept, seen, notes = [], {}, []
    for job in jobs:
        mapped, note = map_job(job)
        if note:
            notes.append(f"sweep grid: {note}")
        identity = tuple(sorted(mapped))
        if identity in seen:
            notes.append(f"sweep grid: {' '.join(job)} is job {seen[identity]} ({' '.join(kept[seen[identity]])}) after mapping: not run again")
            continue
        seen[identity] = len(kept)
        kept.append(mapped)
    return kept, notes


class GridSweeper(BasicSweeper):
    def split_arguments(self, overrides: Any, max_batch_size: int | None) -> list[list[list[str]]]:  # shadows the static method
        jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        kept, notes = map_grid(jobs)
        for note in notes:
            print(note, file=sys.stderr)
        if notes:
            print(f"sweep plan: {len(kept)} jobs" + "".join(f"\n  #{i}: {' '.join(job)}" for i, job in enumerate(kept)), file=sys.stderr)
        if self.config is not None:  # the sweep plan (lab/report/sweep_plan.py) lists the jobs that run, not the grid's
            write_plan(Path(str(self.config.hydra.sweep.dir)), kept)
        named = [job + folder_override(num, job, kept) for num, job in enumerate(kept)]
        size = max_batch_size or len(named) or 1
        return [named[i : i + size] for i in range(0, len(named), size)]


def folder_override(num: int, job: list[str], jobs: list[list[str]]) -> list[str]:
    """`hydra.sweep.subdir='<num>-<settings>'` naming what this job sets differently (none when nothing varies)."""
    settings = job_settings(job, jobs)
    return [] if settings is None else [f"hydra.sweep.subdir='{num}-{settings}'"]

"""Grids across head families: Hydra's basic sweeper, with each job's `head.k` read by the head's own K rule.

`lab-train -m head=ntp,parallel,deepseek head.k=2,4 seed=0,1` is the grid every MTP paper runs, but
ntp predicts one horizon and DeepSeek's K is its depth + 1, so half of its jobs were refused. Here each
job's `head.k` goes through the head spec's `options_at` (lab/model/heads/spec.py): a head that fixes K
(ntp) drops the override, a head that derives fields from K (deepseek: head.depth = K − 1) gets them,
and jobs that become identical run once. Before the first job trains the console says, per axis and per
head rule rather than per job, what the grid was, what each head's K rule changed, which grid points
repeat a job, the settings every job shares (once) and each job by the settings that tell it apart;
every line is wrapped at 120 characters.
"""

from __future__ import annotations

import os
import sys
import textwrap
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


LINE_WIDTH = 120


def wrapped(line: str) -> list[str]:
    """One console note as lines of at most LINE_WIDTH characters (a single longer word, e.g. a path, stays whole)."""
    indent = " " * (len(line) - len(line.lstrip(" ")) + 4)
    return textwrap.wrap(line, LINE_WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False) or [line]


def varying_keys(jobs: list[list[str]]) -> list[str]:
    """Override keys whose value differs between jobs, or that some jobs lack (first-seen order)."""
    values: dict[str, set] = {}
    for job in jobs:
        for override in job:
            values.setdefault(key_of(override), set()).add(override.partition("=")[2])
    return [key for key, seen in values.items() if len(seen) > 1 or any(key not in map(key_of, job) for job in jobs)]


def shown(job: list[str], keys: list[str]) -> str:
    return " ".join(o for o in job if key_of(o) in keys) or "(no override)"


def plan_lines(jobs: list[list[str]]) -> list[str]:
    """The grid and its mapping summarised per axis and per head (`sweep grid:` lines), then `sweep plan:` with the
    settings every job shares once and one line per job with what tells it apart; nothing when the K rules changed
    no job (the grid runs as given)."""
    kept, notes = map_grid(jobs)
    if not notes:
        return []
    axes = varying_keys(jobs)
    values = {key: list(dict.fromkeys(o.partition("=")[2] for job in jobs for o in job if key_of(o) == key)) for key in axes}
    lines = [f"sweep grid: {' × '.join(axes)} = {len(jobs)} grid points: " + " ".join(f"{key}={','.join(values[key])}" for key in axes)]
    dropped: dict[str, list[str]] = {}
    derived: dict[str, dict[str, list[str]]] = {}
    repeats: dict[str, list[str]] = {}
    fixed: dict[str, int] = {}
    seen: dict[tuple, int] = {}
    for job in jobs:
        mapped, _ = map_job(job)
        items = {key_of(o): o.partition("=")[2] for o in job}
        head, k = items.get("head", "?"), items.get("head.k", "")
        if "head.k" in items and all(key_of(o) != "head.k" for o in mapped):
            from lab.model.heads import HEAD_SPECS

            fixed[head] = HEAD_SPECS[head].options_at(int(k))["k"]
            dropped.setdefault(head, [])
            if k not in dropped[head]:
                dropped[head].append(k)
        extra = [o for o in mapped if o not in job]
        if extra:
            derived.setdefault(head, {}).setdefault(f"head.k={k}", extra)
        identity = tuple(sorted(mapped))
        if identity in seen:
            repeats.setdefault(head, []).append(f"{shown(job, axes)} = #{seen[identity]}")
        else:
            seen[identity] = len(seen)
    for head, ks in dropped.items():
        again = repeats.get(head, [])
        lines.append(f"sweep grid: {head} fixes K = {fixed[head]}: head.k={','.join(ks)} dropped from its jobs"
                     + (f"; {len(again)} grid point(s) then repeat a job, not run again: {', '.join(again)}" if again else ""))
    for head, by_k in derived.items():
        lines.append(f"sweep grid: {head} derives from head.k: " + ", ".join(f"{k} → {' '.join(extra)}" for k, extra in by_k.items()))
    for head, again in repeats.items():
        if head not in dropped:
            lines.append(f"sweep grid: {head}: {len(again)} grid point(s) repeat a job after mapping, not run again: {', '.join(again)}")
    apart = varying_keys(kept)
    shared = [o for o in kept[0] if key_of(o) not in apart] if kept else []
    lines.append(f"sweep plan: {len(kept)} jobs ({len(jobs) - len(kept)} of {len(jobs)} grid points dropped as repeats)"
                 + (f"; every job: {' '.join(shared)}" if shared else ""))
    lines += [f"  #{i}: {shown(job, apart)}" for i, job in enumerate(kept)]
    return lines


class GridSweeper(BasicSweeper):
    def sweep(self, arguments: list[str]) -> Any:
        """Hydra's sweep; a job whose process was killed inside the parallel launcher ends it in one line, not joblib's
        traceback: the launcher loses every job in flight with that worker, so the sweep cannot go on by itself."""
        # loky's resource tracker warns, at exit and after the last line, about a killed worker's semaphores (harmless:
        # it removes them); it starts with the launcher's first workers and reads this then.
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), "ignore:resource_tracker:UserWarning"]))
        try:
            return super().sweep(arguments)
        except Exception as error:
            if type(error).__name__ != "TerminatedWorkerError":  # joblib's (loky's) class: no import of joblib needed
                raise
            sweep_dir = Path(str(self.config.hydra.sweep.dir))
            print(f"error: hydra/launcher: a job's process was killed ({killed_signals(error)}: out of memory, or a kill "
                  f"from outside) and the parallel launcher stopped the jobs running beside it; {finished_jobs(sweep_dir)}. "
                  f"`lab-resume {sweep_dir}` finishes the rest", file=sys.stderr, flush=True)
            sys.exit(1)

    def split_arguments(self, overrides: Any, max_batch_size: int | None) -> list[list[list[str]]]:  # shadows the static method
        jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        kept, _ = map_grid(jobs)
        for line in plan_lines(jobs) + self.equivalent_settings(kept):
            print("\n".join(wrapped(line)), file=sys.stderr)
        if self.config is not None:  # the sweep plan (lab/report/sweep_plan.py) lists the jobs that run, not the grid's
            write_plan(Path(str(self.config.hydra.sweep.dir)), kept)
        named = [job + folder_override(num, job, kept) for num, job in enumerate(kept)]
        size = max_batch_size or len(named) or 1
        return [named[i : i + size] for i in range(0, len(named), size)]

    def equivalent_settings(self, jobs: list[list[str]]) -> list[str]:
        """`sweep grid:` notes on swept loss weightings that differ only by a constant factor (lab/run/equivalent_settings.py)."""
        if self.hydra_context is None or self.config is None:
            return []
        from lab.run.equivalent_settings import equivalence_notes

        try:
            return equivalence_notes(jobs, lambda job: self.hydra_context.config_loader.load_sweep_config(self.config, list(job)))
        except Exception:  # a job that does not compose fails on its own, with its own message
            return []


def folder_override(num: int, job: list[str], jobs: list[list[str]]) -> list[str]:
    """`hydra.sweep.subdir='<num>-<settings>'` naming what this job sets differently (none when nothing varies)."""
    settings = job_settings(job, jobs)
    return [] if settings is None else [f"hydra.sweep.subdir='{num}-{settings}'"]


def killed_signals(error: Exception) -> str:
    """'SIGKILL(-9)' from loky's message ("The exit codes of the workers are {SIGKILL(-9)}"), or 'a signal'."""
    text = str(error)
    start = text.find("exit codes of the workers are {")
    return text[start + 31 : text.find("}", start)] if start >= 0 else "a signal"


def finished_jobs(sweep_dir: Path) -> str:
    """'2 of 12 jobs finished' from the jobs' run.json and the sweep plan."""
    import json

    from lab.report.sweep_plan import read_plan

    statuses = []
    for record in sorted(sweep_dir.glob("*/run.json")):
        try:
            statuses.append(json.loads(record.read_text()).get("status"))
        except (OSError, ValueError):
            statuses.append(None)
    planned = read_plan(sweep_dir)
    total = len(planned) if planned else len(statuses)
    return f"{sum(status == 'ok' for status in statuses)} of {total} jobs finished"

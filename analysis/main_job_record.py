"""results/main_job.json from a `lab-train experiment=quick_ablation` sweep: its table computed from runs.csv, each job's
full-precision validation loss and numerics fingerprint kept beside it (python -m analysis.results --record-main-job DIR)."""

from __future__ import annotations

import csv
import datetime
import json
import math
import statistics
from pathlib import Path

from analysis.result_records import RecordError
from lab.report.noise import SE_MULTIPLE
from lab.tracking.numerics import code_version

COMMAND = "lab-train experiment=quick_ablation"
COLUMNS = ["architecture", "val loss (nats), mean ± sd", "vs ntp (noise floor)", "seeds", "parameters", "training FLOPs / token"]


def pooled_sd(groups: list[list[float]]) -> float:
    """The sample sd over seeds pooled across groups of ≥ 2 (the report's noise floor, lab/report/noise.py)."""
    groups = [g for g in groups if len(g) >= 2]
    return math.sqrt(sum(statistics.variance(g) * (len(g) - 1) for g in groups) / sum(len(g) - 1 for g in groups))


def read_jobs(sweep_dir: Path) -> list[dict]:
    runs = sweep_dir / "runs.csv"
    if not runs.is_file():
        raise RecordError(f"{sweep_dir}: no runs.csv (not a finished sweep folder)")
    jobs = list(csv.DictReader(runs.open(newline="")))
    failed = [job["run_dir"] for job in jobs if job["status"] != "ok"]
    if failed or not jobs:
        raise RecordError(f"{runs}: jobs not ok: {failed or 'none at all'}; a record is written from a complete sweep only")
    for job in jobs:
        run = json.loads((sweep_dir / job["run_dir"] / "run.json").read_text())
        job["numerics"] = run.get("numerics") or {}
        job["git_commit"] = run.get("git_commit")
        job["baseline"] = bool((run.get("head_traits") or {}).get("baseline"))  # the next-token baseline (ntp)
    return jobs


def main_job_rows(jobs: list[dict]) -> list[list[str]]:
    """One row per head: the baseline first, then by mean loss; each gap to the baseline against the noise floor."""
    by_head: dict[str, list[dict]] = {}
    for job in jobs:
        by_head.setdefault(job["head"], []).append(job)
    losses = {head: [float(j["val/loss"]) for j in group] for head, group in by_head.items()}
    baseline = next(head for head, group in by_head.items() if group[0]["baseline"])
    base, sd = statistics.fmean(losses[baseline]), pooled_sd(list(losses.values()))
    rows = []
    for head in sorted(by_head, key=lambda h: (h != baseline, statistics.fmean(losses[h]))):
        mean, first = statistics.fmean(losses[head]), by_head[head][0]
        spread = statistics.stdev(losses[head]) if len(losses[head]) > 1 else float("nan")
        floor = SE_MULTIPLE * sd * math.sqrt(1 / len(losses[head]) + 1 / len(losses[baseline]))  # lab/report/noise.py's rule
        versus = "—" if head == baseline else f"{mean - base:+.4f} ({'clears' if abs(mean - base) > floor else 'a tie: inside'} {floor:.3f})"
        rows.append([f"`{head}`", f"{mean:.4f} ± {spread:.4f}", versus, str(len(losses[head])),
                     f"{float(first['params_total']) / 1e6:.3f} M", f"{float(first['train_flops_per_token']) / 1e6:.2f} M"])
    return rows


def write_main_job_record(sweep_dir: Path, results: Path) -> Path:
    jobs = read_jobs(sweep_dir)
    fingerprints = {json.dumps(job["numerics"], sort_keys=True) for job in jobs}
    if len(fingerprints) != 1:
        raise RecordError(f"{sweep_dir}: its jobs computed under {len(fingerprints)} numerics fingerprints; a record needs one")
    record = {
        "id": "main_job", "title": "The main job: final validation next-token loss after 240 steps, 2 seeds",
        "command": COMMAND, "commit": jobs[0]["git_commit"] or code_version(Path(__file__).parent), "date": datetime.date.today().isoformat(),
        "machine": jobs[0]["numerics"], "provenance": "measured (python -m analysis.results --record-main-job)",
        "columns": COLUMNS, "rows": main_job_rows(jobs),
        "jobs": [{"overrides": job["overrides"], "val/loss": job["val/loss"], "run_time_s": job["run_time_s"]} for job in jobs],
    }
    path = results / "main_job.json"
    results.mkdir(exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    return path

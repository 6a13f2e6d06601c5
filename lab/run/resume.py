"""`lab-resume SWEEP_DIR`: finish a sweep whose jobs were killed or failed, then rebuild its report.

Every job whose run.json is missing or not `ok` is run again in its own directory with its own
overrides and `ckpt_path=last`: the ordinary resume path of `lab-train` (continue from
`<job dir>/checkpoints/last.ckpt`, or start from step 0 when the job died before its first
checkpoint). Jobs the sweep planned but never started (`sweep_plan.json`) then run in the
folder the sweep would have given them. Jobs that finished are left untouched. Bad input ends
with one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from lab.config.paths import CONF_DIR
from lab.errors import ConfigError
from lab.report.records import NOT_STARTED, ReportError, collect_sweep, hydra_job_settings
from lab.run.lock import lock_directory

DROPPED = ("ckpt_path", "hydra.run.dir", "hydra.sweep.dir", "hydra.mode", "hydra.job.num")  # replaced below


def job_status(job_dir: Path) -> str:
    run_json = job_dir / "run.json"
    if not run_json.exists():
        return "no run.json"
    try:
        return str(json.loads(run_json.read_text()).get("status"))
    except json.JSONDecodeError:
        return "unreadable run.json"


def resume_argv(job_dir: Path, sweep_dir: Path) -> list[str]:
    """The job's own overrides, as one RUN-mode job in its directory, resuming from last.ckpt."""
    overrides = yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()) or []
    kept = [str(o) for o in overrides if str(o).partition("=")[0].lstrip("+~") not in DROPPED]
    num = (hydra_job_settings(job_dir).get("job") or {}).get("num")
    extra = [f"hydra.job.num={num}"] if isinstance(num, int) else []
    return [*kept, "hydra.mode=RUN", f"hydra.run.dir={job_dir.resolve()}", f"hydra.sweep.dir={sweep_dir.resolve()}", *extra,
            "ckpt_path=last"]


def unfinished(sweep_dir: Path) -> list[tuple[Path, str]]:
    sweep = collect_sweep(sweep_dir)
    jobs = [sweep_dir / record["run_dir"] for record in sweep.records if record["status"] != NOT_STARTED]
    return [(job, job_status(job)) for job in jobs if job_status(job) != "ok"]


def not_started(sweep_dir: Path) -> list[dict]:
    """Planned jobs without a folder (lab/report/sweep_plan.py), in job order."""
    return [record for record in collect_sweep(sweep_dir).records if record["status"] == NOT_STARTED]


def sweep_cwd(sweep_dir: Path) -> str | None:
    """The directory the sweep ran in (its relative paths, e.g. data.path, are relative to it)."""
    try:
        cwd = ((yaml.safe_load((sweep_dir / "multirun.yaml").read_text()) or {}).get("hydra") or {}).get("runtime", {}).get("cwd")
    except (OSError, yaml.YAMLError):
        return None
    return cwd if cwd and Path(cwd).is_dir() else None


def start_argv(job: dict, sweep_dir: Path) -> list[str]:
    """A planned job that never ran: its overrides, as one RUN-mode job in the folder the sweep would have given it."""
    from lab.config.preflight import compose
    from lab.report.sweep_plan import read_plan
    from lab.run.job_folder import job_settings

    number = [f"hydra.job.num={job['job']}"]
    settings = job_settings(job["overrides"], [planned["overrides"] for planned in read_plan(sweep_dir)])  # as the grid sweeper names it
    subdir = f"{job['job']}-{settings}" if settings is not None else \
        OmegaConf.select(compose(CONF_DIR, [*job["overrides"], *number], with_hydra=True), "hydra.sweep.subdir")
    job_dir = sweep_dir.resolve() / str(subdir)
    return [*job["overrides"], "hydra.mode=RUN", f"hydra.run.dir={job_dir}", f"hydra.sweep.dir={sweep_dir.resolve()}", *number]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lab-resume", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", help="a sweep directory written by `lab-train -m` or an experiment")
    parser.add_argument("--dry-run", action="store_true", help="list the jobs that would be re-run, run nothing")
    return parser.parse_args(argv)


def rerun(job_dir: Path, sweep_dir: Path, status: str, dry_run: bool) -> bool:
    """Run one job again through `lab-train` (in the directory it first ran in); True when it ends ok."""
    cwd = (hydra_job_settings(job_dir).get("runtime") or {}).get("cwd")  # relative paths in the overrides
    ran = run_job(f"resuming {job_dir.name} ({status})", resume_argv(job_dir, sweep_dir), cwd if cwd and Path(cwd).is_dir() else None, dry_run)
    return ran and (dry_run or job_status(job_dir) == "ok")


def start(job: dict, sweep_dir: Path, dry_run: bool) -> bool:
    """Run a planned job that never started, in the sweep's working directory; True when it ends ok."""
    return run_job(f"starting job {job['job']} (not started)", start_argv(job, sweep_dir), sweep_cwd(sweep_dir), dry_run)


def run_job(what: str, argv: list[str], cwd: str | None, dry_run: bool) -> bool:
    command = [sys.executable, "-m", "lab.train", *argv]
    print(f"{what}: lab-train {' '.join(argv)}", flush=True)
    if dry_run:
        return True
    return subprocess.run(command, cwd=cwd).returncode == 0


def main(argv: list[str] | None = None) -> None:
    from lab.report.build import build_sweep_report

    args = parse_args(argv)
    sweep_dir = Path(args.sweep_dir)
    try:
        if not args.dry_run and sweep_dir.is_dir():
            lock_directory(sweep_dir, "sweep_dir")  # one lab-resume (or running sweep) per sweep
        todo, planned = unfinished(sweep_dir), not_started(sweep_dir)
        print(f"lab-resume: {len(todo)} unfinished or failed job(s) in {sweep_dir}; {len(planned)} not started")
        still_failed = sum(not rerun(job_dir, sweep_dir, status, args.dry_run) for job_dir, status in todo)
        still_failed += sum(not start(job, sweep_dir, args.dry_run) for job in planned)
        if args.dry_run:
            return
        report = build_sweep_report(sweep_dir)
    except (ReportError, ConfigError) as error:  # not a sweep, in use, or (after the re-runs) no completed job to report on
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"report: {report.html} ({report.counts})")
    if still_failed:
        sys.exit(1)


if __name__ == "__main__":
    main()

"""`lab-report SWEEP_DIR` rebuilds a sweep's report; `lab-report --wandb ENTITY/PROJECT --group NAME --out DIR`
builds the same report from wandb's public API.

`--publish` (a wandb Report) and `--workspace` (a saved wandb Workspace view) put the sweep into
wandb itself, from the public API's runs (`--wandb E/P --group G`) or from a sweep directory
(`SWEEP_DIR --wandb E/P`); `--dry-run FILE` writes what would be saved to a JSON file instead.

Bad input ends with one line `error: ...` and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from lab.report.records import ReportError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lab-report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", nargs="?", help="a Hydra multirun directory (holds multirun.yaml and one directory per job)")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read the runs from wandb's public API instead")
    parser.add_argument("--group", help="wandb group (= the sweep name) with --wandb")
    parser.add_argument("--out", help="output directory (default: the sweep directory; required with --wandb unless publishing)")
    parser.add_argument("--publish", action="store_true", help="save a wandb Report of the sweep into ENTITY/PROJECT (needs the wandb-reports extra)")
    parser.add_argument("--workspace", action="store_true", help="save a wandb Workspace view of the sweep's group")
    parser.add_argument("--title", help="the Report's title (default: 'Sweep report: GROUP')")
    parser.add_argument("--dry-run", metavar="FILE", help="with --publish/--workspace: write the Report/Workspace model to FILE (JSON) instead of saving it")
    parser.add_argument("--baseline", metavar="LABEL", help="the variant differences are taken to, by its label in the report "
                        "(e.g. 'head=ntp'); default: the ntp variant when the sweep has exactly one, else none")
    parser.add_argument("--force", action="store_true", help="report on a folder of runs that is not a Hydra sweep (no multirun.yaml)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        if args.publish or args.workspace or args.dry_run:
            return publish(args)
        report = run(args)
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"report: {report.html} ({report.counts}; runs.csv, report.md, {len(report.figures)} figures)")


def run(args: argparse.Namespace):
    from lab.report.build import build_report
    from lab.report.records import collect_sweep

    if args.wandb:
        if args.sweep_dir:
            raise ReportError("give either SWEEP_DIR or --wandb ENTITY/PROJECT, not both")
        if not args.group or not args.out:
            raise ReportError("--wandb needs --group NAME and --out DIR")
        from lab.report.wandb_source import sweep_from_wandb

        return build_report(sweep_from_wandb(args.wandb, args.group), args.out, args.baseline)
    if not args.sweep_dir:
        raise ReportError("SWEEP_DIR: missing (or use --wandb ENTITY/PROJECT --group NAME --out DIR)")
    return build_report(collect_sweep(args.sweep_dir, force=args.force), args.out or args.sweep_dir, args.baseline)


def publish(args: argparse.Namespace) -> None:
    from lab.report import wandb_report

    if not (args.publish or args.workspace):
        raise ReportError("--dry-run: give --publish and/or --workspace (what to build)")
    wandb_report.wandb_workspaces()  # the optional extra, before anything is read or written
    if not args.wandb or args.wandb.count("/") != 1 or not all(args.wandb.split("/")):
        raise ReportError(f"--wandb: --publish/--workspace need ENTITY/PROJECT (where to save), got '{args.wandb or ''}'")
    entity, project = args.wandb.split("/")
    options = {"title": args.title, "report": args.publish, "workspace": args.workspace, "dry_run": args.dry_run}
    if args.sweep_dir:
        done = wandb_report.publish_sweep_dir(args.sweep_dir, entity=entity, project=project, group=args.group, **options)
    else:
        if not args.group:
            raise ReportError("--wandb needs --group NAME (or give SWEEP_DIR to read the runs from disk)")
        from lab.report.build import build_report
        from lab.report.records import sweep_from_wandb_runs
        from lab.report.wandb_source import fetch_runs

        runs = fetch_runs(args.wandb, args.group)
        configs = wandb_report.job_configs(runs)
        if not configs:
            raise ReportError(f"--wandb {args.wandb} --group {args.group}: no job runs in this group")
        sweep = sweep_from_wandb_runs(runs, source=f"wandb:{args.wandb}/{args.group}", name=args.group)
        if args.out:
            build_report(sweep, args.out)
        done = wandb_report.publish(sweep, configs, entity=entity, project=project, group=args.group, **options)
    if done.dry_run is not None:
        print(f"wandb report: dry run written to {done.dry_run} ({done.n_panels} panels; nothing saved)")
    for kind, url in (("report", done.report_url), ("workspace", done.workspace_url)):
        if url:
            print(f"wandb {kind}: {url}")


if __name__ == "__main__":
    main()

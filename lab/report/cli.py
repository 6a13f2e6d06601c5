"""`lab-report SWEEP_DIR` rebuilds a sweep's report; `lab-report --wandb ENTITY/PROJECT --group NAME --out DIR`
builds the same report from wandb's public API.

`lab-report DIR1 DIR2 ... --out DIR` pools several sweep folders into one report (refused in one line when a setting
that none of them varies differs between them). `--title T` names the report (page, heading, wandb Report).

`--publish` (a wandb Report) and `--workspace` (a saved wandb Workspace view) put the sweep into
wandb itself, from the public API's runs (`--wandb E/P --group G`) or from a sweep directory
(`SWEEP_DIR --wandb E/P`); `--dry-run FILE` writes what would be saved to a JSON file instead.
`--view FILE` renders such a dry run as a local HTML page; `--publish-from FILE ENTITY/PROJECT` saves it later.

Bad input ends with one line `error: ...` and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from lab.report.records import ReportError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lab-report", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dirs", nargs="*", metavar="SWEEP_DIR", help="a Hydra multirun directory (holds multirun.yaml and one "
                        "directory per job); several: one report of their pooled runs (needs --out)")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read the runs from wandb's public API instead")
    parser.add_argument("--group", help="wandb group (= the sweep name) with --wandb")
    parser.add_argument("--out", help="output directory (default: the sweep directory; required with --wandb unless publishing, and with "
                        "several sweep folders); with --view: the HTML file")
    parser.add_argument("--publish", action="store_true", help="save a wandb Report of the sweep into ENTITY/PROJECT (needs the wandb-reports extra)")
    parser.add_argument("--workspace", action="store_true", help="save a wandb Workspace view of the sweep's group")
    parser.add_argument("--title", help="the report's title: report.html's title and heading, report.md's heading and the wandb "
                        "Report's (default: what the sweep varied and its job count, e.g. 'head × head.k × seed, 10 jobs')")
    parser.add_argument("--dry-run", metavar="FILE", help="with --publish/--workspace: write the Report/Workspace model to FILE (JSON) instead of saving it")
    parser.add_argument("--view", metavar="FILE", help="render a --dry-run JSON file as a local HTML page (FILE.view.html, or --out)")
    parser.add_argument("--publish-from", nargs=2, metavar=("FILE", "ENTITY/PROJECT"), help="save the wandb Report (and Workspace) of "
                        "a --dry-run JSON file into ENTITY/PROJECT (network; needs the wandb-reports extra)")
    parser.add_argument("--baseline", metavar="LABEL", help="the variant differences are taken to, by its label in the report "
                        "(e.g. 'head=ntp'); default: the ntp variant when the sweep has exactly one, else none")
    parser.add_argument("--label", action="append", default=[], metavar="OLD=NEW", help="show variant OLD (its label in the report, "
                        "e.g. 'head=parallel head.k=4', or its figure label 'parallel K=4') as NEW in every figure, table and finding; repeatable")
    parser.add_argument("--labels", metavar="FILE", help="YAML mapping {OLD: NEW}, the same as --label for each entry")
    parser.add_argument("--force", action="store_true", help="report on a folder of runs that is not a Hydra sweep (no multirun.yaml)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        if args.view:
            return view(args)
        if args.publish_from:
            return publish_from(args)
        if args.publish or args.workspace or args.dry_run:
            return publish(args)
        report = run(args)
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"report: {report.html} ({report.counts}; runs.csv, report.md, {len(report.figures)} figures)")


def run(args: argparse.Namespace):
    from lab.report.build import build_report
    from lab.report.pooling import collect_sweeps

    if args.wandb:
        if args.sweep_dirs:
            raise ReportError("give either SWEEP_DIR or --wandb ENTITY/PROJECT, not both")
        if not args.group or not args.out:
            raise ReportError("--wandb needs --group NAME and --out DIR")
        from lab.report.wandb_source import sweep_from_wandb

        return build_report(sweep_from_wandb(args.wandb, args.group), args.out, args.baseline, args.title, **label_options(args))
    if not args.sweep_dirs:
        raise ReportError("SWEEP_DIR: missing (or use --wandb ENTITY/PROJECT --group NAME --out DIR)")
    if len(args.sweep_dirs) > 1 and not args.out:
        raise ReportError(f"--out: required with several sweep folders ({len(args.sweep_dirs)} given): where their pooled report goes")
    sweep = collect_sweeps(args.sweep_dirs, force=args.force)  # refuses incompatible folders before anything is written
    return build_report(sweep, args.out or args.sweep_dirs[0], args.baseline, args.title, **label_options(args))


def label_options(args: argparse.Namespace) -> dict:
    """`--label OLD=NEW` (repeatable) and `--labels FILE` as build_report's `labels` / `label_args` (checked there,
    against the sweep's variants, before anything is written)."""
    from lab.report.labels import check_label_args, read_labels_file

    return {"labels": read_labels_file(args.labels) if args.labels else {}, "label_args": check_label_args(args.label)}


def publish(args: argparse.Namespace) -> None:
    from lab.report import wandb_report

    if not (args.publish or args.workspace):
        raise ReportError("--dry-run: give --publish and/or --workspace (what to build)")
    if len(args.sweep_dirs) > 1:
        raise ReportError(f"--publish/--workspace: one sweep folder at a time ({len(args.sweep_dirs)} given)")
    wandb_report.wandb_workspaces()  # the optional extra, before anything is read or written
    if not args.wandb or args.wandb.count("/") != 1 or not all(args.wandb.split("/")):
        raise ReportError(f"--wandb: --publish/--workspace need ENTITY/PROJECT (where to save), got '{args.wandb or ''}'")
    entity, project = args.wandb.split("/")
    options = {"title": args.title, "report": args.publish, "workspace": args.workspace, "dry_run": args.dry_run}
    if args.sweep_dirs:
        done = wandb_report.publish_sweep_dir(args.sweep_dirs[0], entity=entity, project=project, group=args.group, **options)
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
            build_report(sweep, args.out, title=args.title)
        done = wandb_report.publish(sweep, configs, entity=entity, project=project, group=args.group, **options)
    if done.dry_run is not None:
        print(f"wandb report: dry run written to {done.dry_run} ({done.n_panels} panels; nothing saved)")
    for kind, url in (("report", done.report_url), ("workspace", done.workspace_url)):
        if url:
            print(f"wandb {kind}: {url}")


def view(args: argparse.Namespace) -> None:
    """`--view FILE`: the dry run's Report (and Workspace) as a self-contained HTML page, no network, no wandb login."""
    from lab.report.wandb_view import write_view

    if args.sweep_dirs or args.publish or args.workspace or args.publish_from:
        raise ReportError("--view FILE: give the dry-run JSON file alone (and --out PAGE.html)")
    page = write_view(args.view, args.out)
    print(f"wandb report view: {page}")


def publish_from(args: argparse.Namespace) -> None:
    """`--publish-from FILE ENTITY/PROJECT`: save what a dry run wrote, e.g. after `wandb sync` on a machine with network."""
    from lab.report.wandb_view import publish_dry_run

    if args.sweep_dirs or args.publish or args.workspace or args.dry_run or args.view:
        raise ReportError("--publish-from FILE ENTITY/PROJECT: give the dry-run JSON file and where to save it, nothing else")
    path, target = args.publish_from
    for kind, url in publish_dry_run(path, target, title=args.title):
        print(f"wandb {kind}: {url}")


if __name__ == "__main__":
    main()

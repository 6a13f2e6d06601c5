"""`lab-report SWEEP_DIR` rebuilds a sweep's report; `lab-report --wandb ENTITY/PROJECT --group NAME --out DIR`
builds the same report from wandb's public API.

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
    parser.add_argument("--out", help="output directory (default: the sweep directory; required with --wandb)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        report = run(args)
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"report: {report.html} ({report.n_ok} ok, {report.n_failed} failed; runs.csv, report.md, {len(report.figures)} figures)")


def run(args: argparse.Namespace):
    from lab.report.build import build_report
    from lab.report.records import collect_sweep

    if args.wandb:
        if args.sweep_dir:
            raise ReportError("give either SWEEP_DIR or --wandb ENTITY/PROJECT, not both")
        if not args.group or not args.out:
            raise ReportError("--wandb needs --group NAME and --out DIR")
        from lab.report.wandb_source import sweep_from_wandb

        return build_report(sweep_from_wandb(args.wandb, args.group), args.out)
    if not args.sweep_dir:
        raise ReportError("SWEEP_DIR: missing (or use --wandb ENTITY/PROJECT --group NAME --out DIR)")
    return build_report(collect_sweep(args.sweep_dir), args.out or args.sweep_dir)


if __name__ == "__main__":
    main()

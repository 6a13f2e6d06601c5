"""The records behind the README's and docs' tables, and the command that regenerates those tables from them.

    python -m analysis.results                      rewrite every marked table from results/*.json
    python -m analysis.results --check              exit 1 when a committed table differs from its record (CI's test)
    python -m analysis.results --record-main-job SWEEP_DIR
                                                    write results/main_job.json from a `lab-train experiment=quick_ablation`
                                                    sweep's runs.csv and run.json files (nothing retyped)

A record (results/<id>.json) holds one table and what stands behind it:

    id, title      the table's name (a document marks where it goes: <!-- results:ID --> … <!-- /results -->)
    command        the command that measured it; `lab-train …` commands must still compose, `python -m MODULE …` must
                   name a module that imports
    commit, date   the code and the day it was measured
    machine        the numerics fingerprint (lab/tracking/numerics.py), or a sentence where none was recorded
    provenance     "measured": written by this tool from run files; or how the values reached the record
    columns, rows  the table's cells, as the documents show them
    jobs           (optional) the raw per-job values a measured table was computed from

A corrected number is a new commit of its record: the history of results/ is the history of the claims.
Bad input (a record missing a field, a command that no longer composes, a marker naming no record): one line naming
the file, exit 2, nothing rewritten.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis.result_records import ROOT, RecordError, load_records, stale_documents, unused_records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a committed table differs from its record")
    parser.add_argument("--record-main-job", metavar="SWEEP_DIR", help="write results/main_job.json from this sweep")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose results/ and documents are read")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.record_main_job:
            from analysis.main_job_record import write_main_job_record

            print(f"wrote {write_main_job_record(Path(args.record_main_job), root / 'results')}")
        records = load_records(root / "results")
        stale = stale_documents(records, root)
    except RecordError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    for name in unused_records(records, root):
        print(f"note: results/{name}.json is shown in no document", file=sys.stderr)
    if args.check:
        for path in stale:
            print(f"stale: {path.relative_to(root)} differs from its records (run python -m analysis.results)", file=sys.stderr)
        sys.exit(1 if stale else 0)
    for path, text in stale.items():
        path.write_text(text)
        print(f"rewrote {path.relative_to(root)}")


if __name__ == "__main__":
    main()

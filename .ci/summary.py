"""CI's last word: how many tests ran, skipped (and why) and were left out, over every phase of .ci/run.

Usage: python .ci/summary.py RESULTS   (RESULTS holds, per phase, <phase>.args: its pytest arguments one per
line, and <phase>.xml: its JUnit report, absent when the time budget stopped CI before the phase).

Every collected test must be selected by some phase: one that none selects fails CI (exit 1), listed. A test a
phase selected but did not reach (CI's time budget stopped it) is counted in the last line; it is not a failure.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

NO_INI_MARKERS = ["-o", "addopts=-p no:cacheprovider"]  # the ini's `-m 'not slow'` left out: every test


def collected(args: list[str]) -> set[str]:
    """Node ids pytest selects with `args` (collection only)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", *args],
                         capture_output=True, text=True)
    if out.returncode not in (0, 5):  # 5: nothing selected
        sys.exit(f"error: collecting with {' '.join(args)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return {line.strip() for line in out.stdout.splitlines() if "::" in line and not line.startswith(" ")}


def junit_key(node_id: str) -> tuple[str, str]:
    """'tests/test_x.py::TestC::test_y[a/b]' -> ('tests.test_x.TestC', 'test_y[a/b]'): JUnit's classname and name."""
    path, _, rest = node_id.partition("::")
    parts = rest.split("::")
    return ".".join([path.removesuffix(".py").replace("/", "."), *parts[:-1]]), parts[-1]


def outcomes(report: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(classname, name) -> (passed | skipped | failed, the skip or failure message)."""
    found = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        status, message = "passed", ""
        for child in case:
            if child.tag in ("skipped", "failure", "error"):
                status = "skipped" if child.tag == "skipped" else "failed"
                message = (child.get("message") or "").strip()
        found[(case.get("classname"), case.get("name"))] = (status, message)
    return found


def main(results: Path) -> int:
    every = collected(NO_INI_MARKERS)  # the ini's testpaths
    selected_anywhere, reached, not_reached = set(), {}, 0
    for args_file in sorted(results.glob("*.args")):
        phase = args_file.stem
        selected = collected(args_file.read_text().split("\n")[:-1])
        selected_anywhere |= selected
        report = results / f"{phase}.xml"
        seen = outcomes(report) if report.exists() else {}
        ran = {node: seen[junit_key(node)] for node in selected if junit_key(node) in seen}
        reached.update(ran)
        not_reached += len(selected) - len(ran)
        counts = Counter(status for status, _ in ran.values())
        print(f"phase {phase}: {len(selected)} selected, {counts['passed']} passed, {counts['skipped']} skipped, "
              f"{counts['failed']} failed, {len(selected) - len(ran)} not reached")
    skipped = Counter(message for status, message in reached.values() if status == "skipped")
    for message, count in skipped.most_common():
        print(f"  skipped {count}×: {message}")
    orphans = sorted(every - selected_anywhere)
    for node in orphans[:20]:
        print(f"  in no phase: {node}")
    counts = Counter(status for status, _ in reached.values())
    print(f"tests: {len(every)} collected · {counts['passed'] + counts['failed']} ran ({counts['failed']} failed) · "
          f"{counts['skipped']} skipped · {len(orphans)} selected by no phase · {not_reached} not reached "
          f"(CI's time budget)")
    return 1 if orphans or counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

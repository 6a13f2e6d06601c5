"""Every file path the project's text names exists: docstrings, comments, YAML, docs, tests and README.

A path-like name is a run of path characters that starts with one of the project's top-level
folders (`lab/…`, `conf/…`, `experiments/…`, `analysis/…`, `docs/…`, `tests/…`) and is not part of
a longer path (`outputs/lab/…`) or a template (`conf/head/<name>.yaml`, `{…}`, globs). Markdown
links (`[text](target)`) are checked relative to the page that holds them. After a file moves,
the names that still point at its old place fail here, each with the file and line that names it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED_FOLDERS = ("lab", "conf", "experiments", "analysis", "docs", "tests")
SELF = Path(__file__).resolve()  # its own examples of stale names are on purpose
SCANNED_SUFFIXES = (".py", ".yaml", ".yml", ".md", ".toml", ".txt", ".sh")
TOP_LEVEL = ("lab", "conf", "experiments", "analysis", "docs", "tests")
# Preceded by a path character: the tail of a longer path or of a template, not a project path.
PATH_NAME = re.compile(r"(?<![\w./<>{}-])((?:" + "|".join(TOP_LEVEL) + r")/[\w./-]*)")
TEMPLATE_CONTINUATION = tuple("<{*$[")  # conf/head/<name>.yaml, docs/{page}.md, lab/**/*.py
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
EXTERNAL_LINK = ("http://", "https://", "mailto:", "#")


def scanned_files() -> list[Path]:
    files = [p for folder in SCANNED_FOLDERS for p in sorted((REPO / folder).rglob("*"))
             if p.is_file() and p.suffix in SCANNED_SUFFIXES and "__pycache__" not in p.parts and p != SELF]
    return [*files, REPO / "README.md"]


def path_names(line: str) -> list[str]:
    """The project paths `line` names, trailing sentence punctuation removed."""
    names = []
    for match in PATH_NAME.finditer(line):
        if line[match.end():match.end() + 1].startswith(TEMPLATE_CONTINUATION):
            continue
        names.append(match.group(1).rstrip(".,;:"))
    return names


def link_targets(line: str) -> list[str]:
    """Markdown link targets of `line` that point into the project (anchors dropped)."""
    targets = (match.group(1).split("#")[0] for match in MARKDOWN_LINK.finditer(line))
    return [t for t in targets if t and not t.startswith(EXTERNAL_LINK)]


def missing_paths(files: list[Path]) -> list[str]:
    """`file:line: name` for every named path that does not exist."""
    missing = []
    for file in files:
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
            named = [REPO / name for name in path_names(line)]
            if file.suffix == ".md":
                named += [file.parent / target for target in link_targets(line)]
            missing += [f"{file.relative_to(REPO)}:{number}: {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"
                        for path in named if not path.exists()]
    return missing


def test_every_named_path_exists():
    missing = missing_paths(scanned_files())
    assert not missing, "paths named but not in the repository:\n" + "\n".join(missing)


def test_the_scan_sees_a_moved_file_and_skips_templates(tmp_path, monkeypatch):
    """The checker itself: a stale name and a stale link fail, templates and longer paths do not."""
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("see lab/step.py, lab/training/step.py and [the API](api.md) or [gone](gone.md#x).\n"
                    "conf/head/<name>.yaml, outputs/lab/x.py, lab/**/*.py, `lab/{name}.py`\n", encoding="utf-8")
    (tmp_path / "docs" / "api.md").write_text("", encoding="utf-8")
    (tmp_path / "lab" / "training").mkdir(parents=True)
    (tmp_path / "lab" / "training" / "step.py").write_text("", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert missing_paths([page]) == ["docs/page.md:1: lab/step.py", "docs/page.md:1: docs/gone.md"]

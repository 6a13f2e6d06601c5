"""results/*.json records and the marked tables they fill in the README and docs (the CLI: analysis/results.py)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
DOCUMENTS = ("README.md", "docs/*.md", "experiments/benchmarks/README.md")
FIELDS = ("id", "title", "command", "commit", "date", "machine", "provenance", "columns", "rows")
MARKED = re.compile(r"(<!-- results:(?P<id>[\w-]+) -->\n)(?P<table>.*?)(<!-- /results -->)", re.S)


class RecordError(Exception):
    """A record or document that cannot be used: the message names the file."""


def load_records(folder: Path = RESULTS) -> dict[str, dict]:
    records = {}
    for path in sorted(folder.glob("*.json")):
        records[path.stem] = check_record(path)
    return records


def check_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise RecordError(f"{path}: not a readable JSON record ({error})") from None
    missing = [name for name in FIELDS if name not in record]
    if missing:
        raise RecordError(f"{path}: missing {', '.join(missing)} (a record holds {', '.join(FIELDS)})")
    if record["id"] != path.stem:
        raise RecordError(f"{path}: id {record['id']!r} is not the file's name {path.stem!r}")
    width = len(record["columns"])
    bad = [i for i, row in enumerate(record["rows"]) if len(row) != width]
    if bad:
        raise RecordError(f"{path}: rows {bad} do not have the {width} columns {record['columns']}")
    problem = command_problem(record["command"])
    if problem:
        raise RecordError(f"{path}: command {record['command']!r} {problem}")
    return record


def command_problem(command: str) -> str | None:
    """None when every `lab-train …` part composes and every `python -m MODULE` imports; else what is wrong."""
    for words in command_parts(command):
        if words[:1] == ["lab-train"]:
            problem = compose_problem([w for w in words[1:] if not w.startswith("-")])
        elif words[:2] == ["python", "-m"] and len(words) > 2:
            problem = import_problem(words[2])
        else:
            problem = None
        if problem:
            return problem
    return None


def command_parts(command: str) -> list[list[str]]:
    """The simple commands of a shell line (split at &&, ;, | outside quotes), each as its words."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars="&;|")  # `<run>` placeholders stay words
    lexer.whitespace_split = True
    parts: list[list[str]] = [[]]
    for token in lexer:
        if token in ("&&", ";", "|", "||"):
            parts.append([])
        else:
            parts[-1].append(token)
    return [without_env(words) for words in parts if words]


def without_env(words: list[str]) -> list[str]:
    """The command without its leading environment assignments (`OMP_NUM_THREADS=1 lab-train …`)."""
    while words and re.fullmatch(r"[A-Za-z_]\w*=\S*", words[0]):
        words = words[1:]
    return words


def compose_problem(overrides: list[str]) -> str | None:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from lab.config.paths import CONF_DIR
    from lab.config.preflight import first_job_override, parse
    from lab.config.resolvers import register_resolvers
    from lab.errors import ConfigError

    register_resolvers()
    concrete = [o for o in overrides if "<" not in o]  # `data.path=<folder>`: a placeholder the reader fills in
    try:
        first_job = [line for line in (first_job_override(o) for o in parse(concrete)) if line is not None]  # a sweep's first job
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            compose("train", overrides=first_job)
    except (HydraException, OmegaConfBaseException, ConfigError) as error:
        return f"no longer composes: {str(error).splitlines()[0]}"
    return None


def import_problem(module: str) -> str | None:
    import importlib.util

    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        found = None
    return None if found is not None else f"names module {module!r}, which does not exist"


def markdown_table(record: dict) -> str:
    lines = ["| " + " | ".join(record["columns"]) + " |", "|" + "---|" * len(record["columns"])]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in record["rows"]]
    return "\n".join(lines) + "\n" + source_line(record) + "\n"


def source_line(record: dict) -> str:
    machine = record["machine"] if isinstance(record["machine"], str) else machine_label(record["machine"])
    return (f"<sub>Record `results/{record['id']}.json` · `{record['command']}` · {record['date']}, commit "
            f"{short_commit(record['commit'])} · {machine} · {record['provenance']}</sub>")


def short_commit(commit: str) -> str:
    """`0123456789 + uncommitted changes` from the full hash (and its mark, when the tree was dirty)."""
    head, _, mark = commit.partition(" + ")
    return head[:10] + (f" + {mark}" if mark else "")


def machine_label(fingerprint: dict) -> str:
    from lab.tracking.numerics import fingerprint_label

    return fingerprint_label(fingerprint)


def documents(root: Path = ROOT) -> list[Path]:
    return sorted({path for pattern in DOCUMENTS for path in root.glob(pattern)})


def regenerated(text: str, records: dict[str, dict], path: Path) -> str:
    def fill(match: re.Match) -> str:
        record = records.get(match.group("id"))
        if record is None:
            raise RecordError(f"{path}: marks a table results:{match.group('id')}, but results/{match.group('id')}.json does not exist")
        return match.group(1) + markdown_table(record) + match.group(4)

    return MARKED.sub(fill, text)


def stale_documents(records: dict[str, dict], root: Path = ROOT) -> dict[Path, str]:
    """{document: its regenerated text} for every document whose marked tables differ from their records."""
    out = {}
    for path in documents(root):
        text = path.read_text()
        new = regenerated(text, records, path)
        if new != text:
            out[path] = new
    return out


def unused_records(records: dict[str, dict], root: Path = ROOT) -> list[str]:
    marked = {m.group("id") for path in documents(root) for m in MARKED.finditer(path.read_text())}
    return sorted(set(records) - marked)

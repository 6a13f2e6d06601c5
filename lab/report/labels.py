"""Variant labels: the one place a variant's shown name is made.

A variant's *key* is its report label (lab/report/table.py `variant_label`): the sweep settings other than
the seed as Hydra overrides, e.g. `head=parallel head.k=4`. It names the variant for `--baseline` and in
runs.csv / history.csv. What a reader sees is made here:

- `readable(key)`: the default figure label, `head=parallel head.k=4` → `parallel K=4`,
  `head=deepseek head.k=4 reduction=sum` → `deepseek K=4, reduction sum` (head name first, K and D as
  symbols, other config groups as `group value`, other settings by the last part of their key);
- `--label OLD=NEW` (repeatable) and `--labels labels.yaml` (`{OLD: NEW}`): OLD is a variant's key or its
  readable label; NEW replaces it in every figure, table and finding of the report, and in the paper figures.
  An OLD naming no variant is refused with one line that lists the variants.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from lab.report.records import ReportError

# Settings with a symbol of their own (docs/heads.md): K horizons, D chain depth.
SYMBOLS = {"head.k": "K", "head.depth": "D"}
HEAD_KEY = "head"


def _setting(part: str) -> tuple[str, str] | None:
    key, sep, value = part.partition("=")
    return (key.lstrip("+~"), value) if sep and key.lstrip("+~") else None


def readable(key: str) -> str:
    """`head=parallel head.k=4` → `parallel K=4`; text that is not `key=value` settings is kept as it is."""
    parts = str(key).split()
    settings = [_setting(p) for p in parts]
    if not parts or any(s is None for s in settings):
        return str(key)
    head = [value for name, value in settings if name == HEAD_KEY]
    symbols = [f"{SYMBOLS[name]}={value}" for name, value in settings if name in SYMBOLS]
    others = []
    for name, value in settings:
        if name == HEAD_KEY or name in SYMBOLS:
            continue
        others.append(f"{name} {value}" if "." not in name else f"{name.rsplit('.', 1)[-1]}={value}")
    first = " ".join(head + symbols)
    return ", ".join(([first] if first else []) + others)


def default_labels(keys: list[str]) -> dict[str, str]:
    """key → readable label; keys whose readable forms would coincide keep their key (labels stay distinct)."""
    shown = {key: readable(key) for key in keys}
    counts: dict[str, int] = {}
    for label in shown.values():
        counts[label] = counts.get(label, 0) + 1
    return {key: (label if counts[label] == 1 else key) for key, label in shown.items()}


def check_label_args(pairs: list[str]) -> list[str]:
    """`--label OLD=NEW` arguments as given (OLD itself may hold `=`: `resolve` matches it against the variants)."""
    for pair in pairs:
        if "=" not in pair or pair.startswith("=") or pair.endswith("="):
            raise ReportError(f"--label: expected OLD=NEW (a variant's label, e.g. head=parallel=Parallel), got '{pair}'")
    return list(pairs)


def read_labels_file(path: str | Path) -> dict[str, str]:
    """`--labels labels.yaml`: a mapping {OLD: NEW}."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ReportError(f"--labels: cannot read {path}: {error}") from None
    if not isinstance(data, dict) or not all(isinstance(v, (str, int, float)) for v in data.values()):
        raise ReportError(f"--labels: {path} must hold a mapping OLD: NEW, got {type(data).__name__}")
    return {str(old): str(new) for old, new in data.items()}


def resolve(pairs: list[str], mapping: dict[str, str], keys: list[str], option: str = "--label") -> dict[str, str]:
    """key → NEW for `--label OLD=NEW` pairs and a {OLD: NEW} mapping, OLD being a key or its readable label.

    A pair is split at the `=` that leaves a variant's label on its left (`head=parallel=Parallel`)."""
    names = {key: key for key in keys}
    names.update({label: key for key, label in default_labels(keys).items()})
    allowed = ", ".join(keys)
    out: dict[str, str] = {}
    for old, new in mapping.items():
        if old not in names:
            raise ReportError(f"{option}: '{old}' names no variant; allowed: {allowed}")
        out[names[old]] = new
    for pair in pairs:
        splits = [(pair[:i], pair[i + 1:]) for i, char in enumerate(pair) if char == "="]
        found = [(old, new) for old, new in splits if old in names and new]
        if not found:
            old = pair.rpartition("=")[0] if pair.count("=") > 1 else pair.partition("=")[0]
            raise ReportError(f"{option}: '{old}' names no variant; allowed: {allowed}")
        old, new = max(found, key=lambda item: len(item[0]))
        out[names[old]] = new
    shown = [out.get(key, key) for key in keys]
    if len(set(shown)) != len(shown):
        raise ReportError(f"{option}: two variants would share a label ({', '.join(shown)})")
    return out


def apply(groups, renamed: dict[str, str]) -> None:
    """Rename variants in place (`renamed`: key → NEW): tables, findings and figures then show NEW."""
    for variant in groups:
        variant.label = renamed.get(variant.label, variant.label)


def for_figures(groups, keep=()) -> list:
    """Copies of the variants labelled as figures show them: a settings key in its readable form (`parallel K=4`),
    a label in `keep` (a user's NEW) as given. The records are shared, not copied."""
    shown = default_labels([v.label for v in groups if v.label not in keep])
    out = []
    for variant in groups:
        twin = copy.copy(variant)
        twin.label = shown.get(variant.label, variant.label)
        out.append(twin)
    taken = [v.label for v in out]
    if len(set(taken)) != len(taken):  # a readable label equal to a user's NEW: keep the keys
        for twin, variant in zip(out, groups):
            twin.label = variant.label
    return out

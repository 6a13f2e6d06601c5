"""One typed schema per config group: how a mapping becomes a checked dataclass.

Each group's fields, types and defaults are one dataclass, owned by the object it configures:
`ModelConfig` (lab/nn/blocks.py), each head's `config_class` (lab/model/heads/), `DataConfig`
and the synthetic tasks' configs (lab/data/), `ReductionConfig` / `ScheduleConfig` / the weight
schedules (lab/objective/), `OptimConfig` (lab/training/optim.py). The YAMLs in conf/ choose
values; the dataclasses say what exists.

`check_known` is the harness's one unknown-key check: the command line's overrides
(lab/config/preflight.py, against the composed config) and every builder (`typed`, used by
`build_model`, the heads, `Objective.build`, the DataModules and the weight schedules) go
through it, so a misspelt key is refused with the same line, and a "did you mean", everywhere.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lab.errors import ConfigError


def did_you_mean(name: str, candidates: Sequence[str], prefix: str = "") -> str:
    """' (did you mean <prefix>.<closest>?)' when a candidate is close to `name`, else ''."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {prefix + '.' if prefix else ''}{close[0]}?)"


def check_known(group: str, given: Iterable[str], known: Sequence[str], *, owner: str | None = None) -> None:
    """Refuse the first key of `given` that is not in `known`, in one line naming `group.key`.

    `owner` names what the keys belong to (e.g. "head 'deepseek'"): the line lists the allowed
    keys. Without it the keys are command-line settings: the line says how to add a new one.
    """
    for key in sorted(given):
        if key in known:
            continue
        field = f"{group}.{key}" if group else key
        hint = did_you_mean(key, known, group)
        if owner is not None:
            raise ConfigError(field, f"not an option of {owner}{hint}; allowed: {', '.join(known) or 'none'}")
        what = "no such setting" if group else "no such config group or setting"
        raise ConfigError(field, f"{what}{hint}; to add a new key write +{field}=...")


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def typed(cls: type, values: Mapping[str, Any], group: str, *, owner: str | None = None, exclude: Sequence[str] = ()) -> Any:
    """`cls(**values)` after the unknown-key check; fields left out take the schema's defaults.

    `exclude` lists fields that are set by the caller, not by the config (e.g. a schedule's K).
    The dataclass's own `__post_init__` / `validate` checks the values.
    """
    known = [name for name in field_names(cls) if name not in exclude]
    check_known(group, values, known, owner=owner or f"the {group} group")
    return cls(**values)

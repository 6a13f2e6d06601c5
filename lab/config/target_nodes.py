"""The typed schema of a `_target_` node: the target class's own constructor signature.

`trainer`, `callbacks` and `logger` are nodes Hydra instantiates (`_target_` plus keyword arguments), so
their schema is already written once, as the class's `__init__` signature with its annotations. Before a
run, each node's keys are checked against that signature and each scalar value against its annotation,
so `callbacks.decoding.budget_s=abc` or `logger.wandb.project=3` stops in one line naming the key instead
of failing inside the job with a traceback. Values the class checks itself (ranges, allowed strings) are
checked by the class when Hydra builds it; the harness's own callbacks state those rules in functions
that lab/config/checks.py also runs before the run folder exists.
"""

from __future__ import annotations

import inspect
import math
import types
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lab.errors import ConfigError, is_int, is_number
from lab.schema import check_known

HYDRA_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")
SCALAR_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def check_target_nodes(cfg: DictConfig, group: str) -> None:
    """Every `_target_` node of `group` (the group itself, or each entry of a group of named nodes)."""
    node = cfg.get(group)
    if not isinstance(node, DictConfig):
        return
    if "_target_" in node:
        check_target_node(group, node)
        return
    for name in node.keys():
        child = node.get(name)
        if isinstance(child, DictConfig) and "_target_" in child:
            check_target_node(f"{group}.{name}", child)


def check_target_node(field: str, node: DictConfig) -> None:
    """`node`'s keys are arguments of its `_target_`'s constructor; its scalars fit their annotations."""
    from hydra.utils import get_class

    try:
        target = get_class(str(node._target_))
    except Exception as error:
        raise ConfigError(f"{field}._target_", f"cannot import '{node._target_}' ({str(error).splitlines()[0]})") from None
    names, hints, takes_any = constructor_arguments(target)
    given = [str(key) for key in node.keys() if key not in HYDRA_KEYS]
    if not takes_any:
        check_known(field, given, names, owner=target.__name__)
    for key in given:
        if key in hints and not OmegaConf.is_interpolation(node, key) and not OmegaConf.is_missing(node, key):
            problem = scalar_problem(hints[key], node[key])
            if problem:
                raise ConfigError(f"{field}.{key}", f"{problem} ({target.__name__}'s argument {key}: {type_name(hints[key])})")


def constructor_arguments(target: type) -> tuple[list[str], dict[str, Any], bool]:
    """(argument names, their annotations, whether any other keyword is taken) of `target(...)`. A constructor
    that passes `**kwargs` on (a subclass of a library class) adds the arguments of the next class in its MRO."""
    names, hints = [], {}
    for cls in target.__mro__:
        if cls is object:
            return names, hints, True
        parameters = inspect.signature(cls.__init__).parameters
        named = [name for name, p in parameters.items() if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        names += [name for name in named if name not in names]
        hints = {**{k: v for k, v in annotations_of(cls.__init__).items() if k in named}, **hints}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            return names, hints, False
    return names, hints, True


def annotations_of(function) -> dict[str, Any]:
    """The resolved annotations of `function`; one by one when some cannot be resolved (a name imported only
    for type checkers), leaving those out."""
    try:
        return typing.get_type_hints(function)
    except Exception:
        pass
    namespace = getattr(function, "__globals__", {})
    hints = {}
    for name, annotation in getattr(function, "__annotations__", {}).items():
        try:
            hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation  # noqa: S307 (a signature's own text)
        except Exception:
            continue
    return hints


def scalar_problem(hint: Any, value: Any) -> str | None:
    """Why `value` does not fit `hint` (None: it fits, or `hint` is not built from scalars, so the class decides)."""
    members = set(typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, types.UnionType) else {hint}
    if any(member not in (*SCALAR_NAMES, type(None)) and typing.get_origin(member) is not typing.Literal for member in members):
        return None  # a list, a mapping, a class, Any: not checked here
    literals = {v for member in members if typing.get_origin(member) is typing.Literal for v in typing.get_args(member)}
    if value is None:
        return None if type(None) in members else "must not be null"
    if value in literals or any(fits(member, value) for member in members if member in SCALAR_NAMES):
        return None
    allowed = [SCALAR_NAMES[m] for m in SCALAR_NAMES if m in members] + [repr(v) for v in sorted(literals, key=str)]
    return f"must be {' or '.join(allowed)}, got {value!r}"


def fits(scalar: type, value: Any) -> bool:
    """The typing rule of lab.values, where a float field may also hold ±inf (a schema's "no limit")."""
    if scalar is float:
        return is_number(value) or (isinstance(value, float) and math.isinf(value))
    if scalar is int:
        return is_int(value)
    return isinstance(value, scalar)


def type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")

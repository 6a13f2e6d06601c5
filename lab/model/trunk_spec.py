"""The trunk registry: what each trunk family tells the rest of the harness, so nothing else branches on its kind.

A family is selected by `model.name` (the harness's GPT is the group's default and has no name; `model=hf` is a
transformers causal LM). Its `TrunkSpec` says how its config is typed, how it is built under a head, which head
options it sets or refuses, what it brings to the data config and whether its weights are trained ones. What
decoding needs from a built trunk is asked of the trunk module itself (docs/trunks.md, "the trunk interface"):
`embed`, `blocks`, `final_norm`, `unembedding`, `attention_context`, `forward`, `forward_flops`,
`check_vocabulary`, `context_length`, `transformers_model` and `cache_protocol`.

Adding a family: its module with a config class, a trunk `nn.Module` and a `SPEC`, one line in `SPECS` below (or
`register_trunk(spec)` from outside) and one YAML in `conf/model/` with `name: <family>`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lab.errors import ConfigError, require
from lab.schema import did_you_mean

DEFAULT_TRUNK = "gpt"  # a `model` mapping without `name`
SHIPPED = ("gpt", "hf")  # lab/model/trunks.py


@dataclass(frozen=True)
class TrunkSpec:
    name: str  # model.name that selects it
    config: type  # the typed `model` group of this family (its fields, its own checks in __post_init__)
    build: Callable[[Any, Any], Any]  # (typed model config, HeadConfig) -> trunk nn.Module, head-dependent layers applied
    check_head: Callable[[Any, Any], None] = lambda model_cfg, head_cfg: None  # head options whose meaning depends on it
    # every check that needs no weights; returns why the harness cannot decode this trunk (None: it can)
    preflight: Callable[[Any, Any], str | None] = lambda model_cfg, head_cfg: None
    check_model: Callable[[Any, Any], None] = lambda model_cfg, model: None  # checks on the built MTPModel (its heads too)
    head_defaults: Mapping[str, Any] = field(default_factory=dict)  # head fields it sets where the config leaves null
    fill_vocab_size: Callable[[dict, int], dict] = lambda model, vocab_size: model  # the tokenizer's size into its config
    tokenizer_options: Callable[[dict], dict] = lambda model: {}  # what it sets in the data config (its own tokenizer)
    trained_weights: Callable[[dict], str | None] = lambda model: None  # the setting that loads trained weights, or None
    example: Mapping[str, Any] = field(default_factory=dict)  # a tiny `model` mapping of the family (tests build every family from it)


TRUNK_SPECS: dict[str, TrunkSpec] = {}
# Called after register_trunk / unregister_trunk: lab.config stores the new family's `model/<name>_schema`.
TRUNK_LISTENERS: list[Callable[[], None]] = []


def register_trunk(spec: TrunkSpec) -> None:
    """Add a trunk family (the shipped ones register on import of lab.model.trunks); its name must be new."""
    require(spec.name not in TRUNK_SPECS, "model.name", f"'{spec.name}' is registered already")
    TRUNK_SPECS[spec.name] = spec
    for listener in TRUNK_LISTENERS:
        listener()


def unregister_trunk(name: str) -> None:
    """Remove a family `register_trunk` added (a test's toy trunk)."""
    require(name != DEFAULT_TRUNK and name not in SHIPPED, "model.name", f"'{name}' is a shipped trunk family; only ones added with register_trunk can be removed")
    TRUNK_SPECS.pop(name, None)
    for listener in TRUNK_LISTENERS:
        listener()


def trunk_name(model: Mapping | Any) -> str:
    """The family of a `model` mapping or typed config (`name`, or the default family when it has none)."""
    name = model.get("name") if isinstance(model, Mapping) else getattr(model, "name", None)
    return DEFAULT_TRUNK if name is None else str(name)


def trunk_spec(model: Mapping | Any) -> TrunkSpec:
    """The spec of the family `model` names; an unknown name is refused with the known ones. The shipped families
    are registered by lab/model/trunks.py (imported by lab.model.mtp, and re-exporting this lookup)."""
    name = trunk_name(model)
    if name not in TRUNK_SPECS:
        raise ConfigError("model.name", f"unknown trunk family '{name}'{did_you_mean(name, list(TRUNK_SPECS))}; "
                                        f"allowed: {', '.join(TRUNK_SPECS)}")
    return TRUNK_SPECS[name]

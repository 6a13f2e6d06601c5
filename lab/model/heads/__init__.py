"""Head registry: one folder per architecture, each exposing a `HeadSpec`; selected by `head.name`.

`HEAD_SPECS` maps a name to its spec (lab/model/heads/spec.py). Every consumer reads it — the model
builds `spec.module`, decoding builds `spec.drafter`, `lab-export --format`, `init_from` and
`lab-generate` offer the layouts `spec.release_layouts` names (lab/release/), reports read the traits through the functions below, the
tests parametrise over `spec.example(k)` — so no code outside a head folder compares head names or
format names.

A new architecture is one folder `lab/model/heads/<name>/` (its `MTPHead` subclass, a `HeadConfig`
subclass if it has options of its own, a drafter if the shared independent one does not fit, and `SPEC`
in its `__init__`; a release layout of its own goes in lab/release/ and is named by the spec), one line in `SPECS` below (or `register_head(spec)`
from outside the package) and one YAML in `conf/head/` (docs/heads.md).
"""

from collections.abc import Callable, Mapping

from lab.errors import ConfigError
from lab.model.heads import anticausal, causal, deepseek, identity, linear, medusa, ntp, parallel
from lab.horizon import Horizon, KnownRows, SharedParts, Teacher, endpoint_horizon
from lab.model.heads.base import MTPHead, NextTokenPath
from lab.model.heads.config import HeadConfig
from lab.model.heads.deepseek import DeepSeekConfig
from lab.model.heads.spec import HeadSpec
from lab.nn.blocks import Block

SPECS = (ntp.SPEC, linear.SPEC, parallel.SPEC, causal.SPEC, anticausal.SPEC, deepseek.SPEC, identity.SPEC, medusa.SPEC)

HEAD_SPECS: dict[str, HeadSpec] = {spec.name: spec for spec in SPECS}


# Called after register_head / unregister_head: lab.config re-stores the `head` group's schema, whose
# fields include every registered head's own options.
REGISTRY_LISTENERS: list[Callable[[], None]] = []


def register_head(spec: HeadSpec) -> None:
    """Add an architecture defined outside this package (a plugin, a test's toy head); its name and formats must be new."""
    if spec.name in HEAD_SPECS:
        raise ConfigError("head.name", f"'{spec.name}' is registered already")
    taken = set(spec.release_layouts) & set(declared_layouts())
    if taken:
        raise ConfigError("release_layouts", f"format '{sorted(taken)[0]}' is registered already")
    HEAD_SPECS[spec.name] = spec
    for listener in REGISTRY_LISTENERS:
        listener()


def unregister_head(name: str) -> None:
    """Remove a head `register_head` added (the shipped heads stay)."""
    if name in {spec.name for spec in SPECS}:
        raise ConfigError("head.name", f"'{name}' is a shipped head; only heads added with register_head can be removed")
    HEAD_SPECS.pop(name, None)
    for listener in REGISTRY_LISTENERS:
        listener()


def sharding_units() -> frozenset[type]:
    """Every transformer unit of trunk and heads (heads registered since import included): what FSDP wraps and
    `model.compile` compiles."""
    return frozenset({Block}).union(*(spec.module.sharding_units for spec in HEAD_SPECS.values()))


def head_spec(name: str) -> HeadSpec:
    if name not in HEAD_SPECS:
        raise ConfigError("head.name", f"unknown head '{name}'; allowed: {', '.join(HEAD_SPECS)}")
    return HEAD_SPECS[name]


def head_class(name: str) -> type[MTPHead]:
    return head_spec(name).module


def declared_layouts() -> list[str]:
    """The release layout names every registered head declares (`lab-export --format`), in registry order."""
    return [name for spec in HEAD_SPECS.values() for name in spec.release_layouts]


def display_rank(name: str | None) -> int:
    """Where head `name` stands in tables and figures; unknown names last."""
    return HEAD_SPECS[name].display_rank if name in HEAD_SPECS else max(spec.display_rank for spec in HEAD_SPECS.values()) + 1


def is_baseline(name: str | None) -> bool:
    """Head `name` is the next-token baseline (a head this install does not know is not)."""
    return name in HEAD_SPECS and HEAD_SPECS[name].is_baseline


def teacher_forced(name: str | None) -> bool:
    """Head `name`'s horizon k ≥ 2 metrics are teacher-forced (docs/metrics.md)."""
    return name in HEAD_SPECS and HEAD_SPECS[name].teacher_forced_metrics


def heads_that(capability: str) -> list[str]:
    """The registered heads whose drafter has `capability` (a HeadDrafter flag), in registry order."""
    return [name for name, spec in HEAD_SPECS.items() if spec.drafter is not None and getattr(spec.drafter, capability)]


def report_traits(name: str | None) -> dict:
    """What lab-report needs to know of head `name`; written into run.json (`head_traits`), so the report reads
    it from the record and never imports the model (docs/runs-and-reports.md)."""
    return {"baseline": is_baseline(name), "teacher_forced": teacher_forced(name), "display_rank": display_rank(name)}


def head_config(values: Mapping | HeadConfig) -> HeadConfig:
    """The typed, checked config of head `values["name"]` (default `ntp`); fields left out take their defaults."""
    if isinstance(values, HeadConfig):
        values = {f: getattr(values, f) for f in values.__dataclass_fields__}
    if values.get("compute_match", "") is None:  # null: HeadConfig's default (model=hf: head_defaults_for sets none first)
        values = {key: value for key, value in values.items() if key != "compute_match"}
    if values.get("trunk_grad") != "lora":  # LoRA settings mean nothing otherwise (and stay out of manifests)
        values = {**values, "lora": None}
    return head_class(values.get("name", "ntp")).build_config(dict(values))


__all__ = [
    "HEAD_SPECS", "DeepSeekConfig", "HeadConfig", "HeadSpec", "Horizon", "KnownRows", "MTPHead", "NextTokenPath",
    "SharedParts", "Teacher", "declared_layouts", "display_rank", "endpoint_horizon", "head_class", "head_config", "head_spec", "heads_that",
    "is_baseline", "register_head", "report_traits", "sharding_units", "teacher_forced", "unregister_head",
]

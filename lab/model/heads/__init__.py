"""Head registry: one file per architecture, selected by `head.name`.

The registry's order is the display order of tables and figures; what reports need to know of
an architecture (baseline, teacher-forced metrics, sharding units) is a class attribute, read
through the functions below so that no code outside this package compares head names.

A new architecture is one file here (an `MTPHead` subclass, with a `HeadConfig` subclass if
it has options of its own) plus one entry in `HEADS` and one YAML in `conf/head/`. It drafts
for speculative decoding with the drafter its class names (`MTPHead.drafter`): the independent
heads' (independent_drafter.py) or one of its own, written against lab.inference's protocol.
"""

from collections.abc import Mapping

from lab.errors import ConfigError
from lab.model.heads.anticausal import AnticausalHead
from lab.model.heads.base import HeadConfig, Horizon, KnownRows, MTPHead, NextTokenPath, SharedParts, Teacher, endpoint_horizon
from lab.model.heads.causal import CausalHead
from lab.model.heads.deepseek import DeepSeekConfig, DeepSeekHead
from lab.model.heads.identity import IdentityHead
from lab.model.heads.linear import LinearHead
from lab.model.heads.medusa import MedusaHead
from lab.model.heads.ntp import NextTokenHead
from lab.model.heads.parallel import ParallelHead
from lab.model.trunk import Block

HEADS: dict[str, type[MTPHead]] = {
    "ntp": NextTokenHead,
    "linear": LinearHead,
    "parallel": ParallelHead,
    "causal": CausalHead,
    "anticausal": AnticausalHead,
    "deepseek": DeepSeekHead,
    "identity": IdentityHead,
    "medusa": MedusaHead,
}

# Every transformer unit of trunk and heads: what FSDP wraps and `model.compile` compiles.
SHARDING_UNITS: frozenset[type] = frozenset({Block}).union(*(head.sharding_units for head in HEADS.values()))


def display_rank(name: str | None) -> int:
    """Where head `name` stands in tables and figures: registry order, unknown names last."""
    return list(HEADS).index(name) if name in HEADS else len(HEADS)


def is_baseline(name: str | None) -> bool:
    """Head `name` is the next-token baseline (a head this install does not know is not)."""
    return name in HEADS and HEADS[name].is_baseline


def teacher_forced(name: str | None) -> bool:
    """Head `name`'s horizon k ≥ 2 metrics are teacher-forced (docs/metrics.md)."""
    return name in HEADS and HEADS[name].teacher_forced_metrics


def head_class(name: str) -> type[MTPHead]:
    if name not in HEADS:
        raise ConfigError("head.name", f"unknown head '{name}'; allowed: {', '.join(HEADS)}")
    return HEADS[name]


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
    "HEADS", "SHARDING_UNITS", "DeepSeekConfig", "display_rank", "is_baseline", "teacher_forced", "HeadConfig", "Horizon", "KnownRows", "MTPHead", "NextTokenPath", "SharedParts", "Teacher", "endpoint_horizon", "head_class",
    "head_config",
]

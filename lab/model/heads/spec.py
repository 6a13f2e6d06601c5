"""`HeadSpec`: everything the harness knows of one head architecture, declared in its folder.

Each architecture is a package `lab/model/heads/<name>/` whose `__init__` exposes `SPEC`. Every
consumer reads the spec (through the registry in lab/model/heads/__init__.py), never the name:
training builds `module` with a `config` instance, decoding builds `drafter`, `lab-export --format`
offers the layouts its `release_layouts` names (written in lab/release/, which sits above the model and
the checkpoint files they need), the tests parametrise over `example(k)`, and reports sort and compare
by the traits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from lab.decode_core.proposer import HeadDrafter
from lab.model.heads.base import MTPHead
from lab.model.heads.config import HeadConfig


def no_example_options(k: int) -> Mapping:
    return {}


@dataclass(frozen=True)
class HeadSpec:
    """One head architecture. `config` and `drafter` are read off `module` (stated once, on the class
    that uses them); the report traits are the spec's own."""

    name: str
    module: type[MTPHead]
    display_rank: int  # where it stands in tables and figures (registry order for the shipped heads)
    release_layouts: tuple[str, ...] = ()  # `lab-export --format` names of its layouts (registered in lab/release/)
    is_baseline: bool = False  # the plain next-token model every variant is compared with
    teacher_forced_metrics: bool = False  # horizon k ≥ 2 metrics see the true tokens up to t+k−1 (docs/metrics.md)
    # A head's K rule, for the tests' example configs and for sweep grids (`options_at`): `example_k` is the K the
    # head fixes (ntp: 1; None: any K), `example_options(k)` the fields it derives from K (deepseek: depth = K − 1).
    example_k: int | None = None
    example_options: Callable[[int], Mapping] = no_example_options
    config: type[HeadConfig] = field(init=False)
    drafter: type[HeadDrafter] | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", self.module.config_class)
        object.__setattr__(self, "drafter", self.module.drafter)

    def example(self, k: int) -> dict:
        """The example config at K = `k` (the spec's own K when it fixes one)."""
        return {"name": self.name, **self.options_at(k)}

    def options_at(self, k: int) -> dict:
        """What `head.k=k` in a sweep grid means for this head: its own K when it fixes one, and the fields K decides."""
        k = self.example_k or k
        return {"k": k, **self.example_options(k)}

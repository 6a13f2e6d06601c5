"""Config groups whose fields are one dataclass, registered with Hydra as structured configs.

`conf/<group>/<option>.yaml` starts from `defaults: [schema, _self_]` and keeps only what differs
from the dataclass, so fields, types and defaults are written once; Hydra then refuses an unknown
key or a value of the wrong type while composing (lab/config/preflight.py turns that into one
line). Groups whose fields depend on a choice inside them are not registered here: `head` (each
head's `config_class`; a cross-head sweep sets `head.depth: null` for every head, which one
schema per head would refuse), `data` (text sources vs each synthetic task) and `weights` (each
schedule's dataclass); their builders check them through `lab.schema.typed` instead.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from lab.model.trunk import ModelConfig
from lab.objective.objective import ReductionConfig, ScheduleConfig
from lab.training.optim import OptimConfig


@dataclass
class ModelGroup(ModelConfig):
    """The `model` group: the network (`ModelConfig`) plus how to run it, which is not part of its identity."""

    vocab_size: int | None = None  # null: the tokenizer's size
    compile: bool = False  # torch.compile every transformer unit (lab/model/compile.py); a compiled run resumes eagerly


GROUP_SCHEMAS: dict[str, type] = {"model": ModelGroup, "optim": OptimConfig, "reduction": ReductionConfig, "schedule": ScheduleConfig}


def composable(schema: type) -> type:
    """`schema`'s fields, types and defaults as a mutable dataclass: OmegaConf makes a frozen dataclass's node
    read-only, which would refuse every command-line override (the built objects stay frozen)."""
    if not schema.__dataclass_params__.frozen:
        return schema
    hints = typing.get_type_hints(schema)
    fields = [(f.name, hints[f.name], dataclasses.field(default=f.default, default_factory=f.default_factory))
              for f in dataclasses.fields(schema)]
    return dataclasses.make_dataclass(schema.__name__, fields)


def register_schemas() -> None:
    """Store each schema as `<group>/schema` (idempotent: Hydra replaces an entry of the same name)."""
    store = ConfigStore.instance()
    for group, schema in GROUP_SCHEMAS.items():
        store.store(group=group, name="schema", node=composable(schema))

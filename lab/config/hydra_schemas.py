"""The typed schema of every config group that configures an object, registered with Hydra's ConfigStore.

Each schema is the dataclass of the object the group configures, so fields, types and defaults are
written once, next to the checks in its `__post_init__`. `conf/<group>/<option>.yaml` starts from
`defaults: [<schema>, _self_]` and keeps only what differs; Hydra then refuses an unknown key or a
value of the wrong type while composing (lab/config/preflight.py turns that into one line), and the
builder types the group once (`lab.schema.typed`), which runs the same checks a Python caller gets.

- One schema per group, `<group>/schema`: `model` (the harness's GPT: `ModelConfig` + `compile`),
  `optim`, `reduction`, `schedule`, `paths` (the folders), `train_rows` (corpus or generated), and `head`: the fields every head has (`HeadConfig`) plus every
  registered architecture's own options, null by default ("its default"). One schema for all heads
  because a cross-head sweep keeps one group option while interpolating `head.name`
  (experiments/head_ablation.yaml) or sets one head's option for every head (`head.depth: null`);
  the builder then types the group with the config class of the head `head.name` names
  (`lab.model.heads.head_config`), which refuses another head's option set to a value.
  It is re-stored whenever `register_head` adds an architecture.
- One schema per option, `<group>/<option>_schema`, where the fields depend on the option: `model=<trunk family>`
  (its config class, e.g. `HFModelConfig`, + `compile`), `weights` (each schedule of the registry `WEIGHT_SCHEDULES`, its options
  without K, which comes from the head) and `data` (`corpus_schema`: `DataConfig`, every text source;
  `<task>_schema`: `SyntheticConfig` + the task's fields, each task of the registry `TASKS`).
- `trainer`, `callbacks`, `logger` are `_target_` nodes Hydra instantiates: their schema is the target
  class's constructor signature, which lab/config/target_nodes.py checks each node against before a run.
- Not objects: `hydra` and `hparams_search` (Hydra's own settings), `experiment` and `debug` (presets
  that set other groups' fields).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore

from lab.data.config import DataConfig
from lab.data.synthetic.config import TASKS, SyntheticConfig
from lab.model.heads import HEAD_SPECS, REGISTRY_LISTENERS, HeadConfig
from lab.model import trunks  # noqa: F401  (registers the shipped trunk families)
from lab.model.trunk_spec import DEFAULT_TRUNK, TRUNK_LISTENERS, TRUNK_SPECS
from lab.nn.lora import LORA_DEFAULTS
from lab.nn.blocks import ModelConfig
from lab.objective.objective import ReductionConfig, ScheduleConfig
from lab.objective.weights import WEIGHT_SCHEDULES, schedule_options
from lab.data.train_rows import TrainRowsConfig
from lab.training.optim import OptimConfig


@dataclass
class ModelGroup(ModelConfig):
    """The `model` group: the network (`ModelConfig`) plus how to run it, which is not part of its identity."""

    vocab_size: int | None = None  # null: the tokenizer's size
    compile: bool = False  # torch.compile every transformer unit (lab/model/compile.py); a compiled run resumes eagerly


@dataclass
class PathsGroup:
    """`paths`: the run's folders (strings; an interpolation is resolved when read)."""

    output_dir: str = "${hydra:runtime.output_dir}"  # the run folder Hydra made
    cache_dir: str = "${oc.env:MTP_LAB_CACHE,${oc.env:HOME}/.cache/mtp-lab}"  # tokenised corpora, hidden-state caches, GGUF folders


GROUP_SCHEMAS: dict[str, type] = {
    "model": ModelGroup, "optim": OptimConfig, "reduction": ReductionConfig, "schedule": ScheduleConfig, "paths": PathsGroup,
    "train_rows": TrainRowsConfig,
}


def option_schemas() -> dict[tuple[str, str], list[tuple[str, Any, dataclasses.Field]]]:
    """(group, schema name) → fields, for the groups whose fields depend on the option."""
    schemas = {("data", "corpus_schema"): fields_of(DataConfig)}
    compile_field = ("compile", bool, dataclasses.field(default=False))  # how to run the network, as the `model` group has it
    for name, spec in TRUNK_SPECS.items():  # `model=<family>`: its typed config plus `compile` (the GPT is the group's own schema)
        if name != DEFAULT_TRUNK:
            schemas["model", f"{name}_schema"] = [entry for entry in fields_of(spec.config) if entry[0] != "compile"] + [compile_field]
    common = [entry for entry in fields_of(SyntheticConfig) if entry[0] not in ("source", "task")]
    for source, task in TASKS.items():
        schemas["data", f"{source}_schema"] = [("source", str, dataclasses.field(default=source)), *fields_of(task), *common]
    for name, schedule in WEIGHT_SCHEDULES.items():
        hints = typing.get_type_hints(schedule)
        name_field = ("name", str, dataclasses.field(default=name))
        schemas["weights", f"{name}_schema"] = [name_field] + [(option, hints[f.name], f) for option, f in schedule_options(schedule)]
    return schemas


def head_fields() -> list[tuple[str, Any, dataclasses.Field]]:
    """`head/schema`: HeadConfig's fields, then each registered head's own options as optional, null by default."""
    common = {
        "compute_match": (str | None, dataclasses.field(default=None)),  # null: blocks on the harness's GPT, none on model=hf
        "lora": (Any, dataclasses.field(default_factory=lambda: dict(LORA_DEFAULTS))),  # so `head.lora.r=4` needs no `+`
    }
    fields = [(name, *common[name]) if name in common else (name, hint, f) for name, hint, f in fields_of(HeadConfig)]
    seen = {name for name, _, _ in fields}
    for spec in HEAD_SPECS.values():
        for name, hint, _ in fields_of(spec.config):
            if name not in seen:
                seen.add(name)
                fields.append((name, typing.Optional[hint], dataclasses.field(default=None)))
    return fields


def fields_of(schema: type) -> list[tuple[str, Any, dataclasses.Field]]:
    hints = typing.get_type_hints(schema)
    return [(f.name, hints[f.name], f) for f in dataclasses.fields(schema)]


def composable(name: str, fields: list[tuple[str, Any, dataclasses.Field]]) -> type:
    """A plain mutable dataclass of `fields` (names, types, defaults; no checks, no methods): OmegaConf makes a
    frozen dataclass's node read-only, which would refuse every command-line override."""
    return dataclasses.make_dataclass(name, [
        (field_name, storable(hint), dataclasses.field(default=f.default, default_factory=f.default_factory))
        for field_name, hint, f in fields
    ])


SCALARS = (int, float, bool, str)


def storable(hint: Any) -> Any:
    """`hint` when it is a scalar or an optional scalar, else Any: a list or mapping reaches the built object's
    own checks as given (OmegaConf would convert or refuse its items first, without naming the field's rule)."""
    members = [m for m in typing.get_args(hint) if m is not type(None)] if typing.get_args(hint) else [hint]
    scalar = all(m in SCALARS for m in members) and (hint in SCALARS or type(None) in typing.get_args(hint))
    return hint if scalar and len(members) == 1 else Any


def register_schemas() -> None:
    """Store each schema (idempotent: Hydra replaces an entry of the same name)."""
    store = ConfigStore.instance()
    for group, schema in GROUP_SCHEMAS.items():
        store.store(group=group, name="schema", node=composable(schema.__name__, fields_of(schema)))
    for (group, name), fields in option_schemas().items():
        store.store(group=group, name=name, node=composable(name, fields))
    register_head_schema()


def register_head_schema() -> None:
    ConfigStore.instance().store(group="head", name="schema", node=composable("HeadGroup", head_fields()))


REGISTRY_LISTENERS.append(register_head_schema)
TRUNK_LISTENERS.append(register_schemas)

"""The typed schemas Hydra composes with (lab/config/hydra_schemas.py): each registered group's composed fields are
its object's dataclass fields, a wrong type or a misspelt key is refused while composing, and `head` is typed
by the config class of the head it names."""

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lab.data import DataConfig, TASKS, check_data_config
from lab.data.synthetic import SyntheticConfig
from lab.errors import ConfigError
from lab.model.heads import HEAD_SPECS, HeadConfig, head_config
from lab.model.hf_trunk import HFModelConfig
from lab.nn.lora import LORA_DEFAULTS
from lab.objective.weights import WEIGHT_SCHEDULES, build_weight_schedule, schedule_options
from lab.schema import field_names
from lab.train import CONF_DIR


def composed(overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=overrides)


@pytest.mark.parametrize("name", list(WEIGHT_SCHEDULES))
def test_each_weight_schedule_option_composes_its_schedules_fields(name):
    weights = OmegaConf.to_container(composed([f"weights={name}"]).weights, resolve=True)
    assert list(weights) == ["name", *(option for option, _ in schedule_options(WEIGHT_SCHEDULES[name]))]
    assert weights["name"] == name
    options = {key: value for key, value in weights.items() if key != "name"}
    assert build_weight_schedule(name, 4, **options).k == 4  # what composes builds


@pytest.mark.parametrize("option", ["stdlib", "text", "hub", *TASKS])
def test_each_data_option_composes_its_configs_fields(option):
    data = OmegaConf.to_container(composed([f"data={option}"]).data, resolve=True)
    if option in TASKS:
        expected = [f.name for f in dataclasses.fields(TASKS[option])] + [f.name for f in dataclasses.fields(SyntheticConfig)]
        assert set(data) == set(expected) - {"task"}
        assert check_data_config(data).task == TASKS[option]()  # the YAML keeps the task's defaults
    else:
        assert set(data) == {f.name for f in dataclasses.fields(DataConfig)}


def test_a_wrong_type_is_refused_while_composing():
    """Before the schema a float option took any string here and failed only when the run was built."""
    with pytest.raises(Exception, match="gamma"):
        composed(["weights=geometric", "weights.gamma=abc"])
    with pytest.raises(Exception, match="compile"):
        composed(["model=hf", "model.compile=maybe"])
    with pytest.raises(Exception, match="degree"):
        composed(["data=star_graph", "data.degree=two"])


def test_model_hf_composes_the_hf_models_fields_plus_compile():
    model = composed(["model=hf"]).model
    assert list(model) == [f.name for f in dataclasses.fields(HFModelConfig)] + ["compile"]


def test_head_composes_every_heads_fields_and_refuses_a_wrong_type_while_composing():
    """`head/schema`: HeadConfig's fields, then each registered head's own options as null; a wrong type is
    refused by Hydra before the run is built, another head's option set to a value by the builder."""
    head = composed(["head=parallel"]).head
    own = [name for spec in HEAD_SPECS.values() for name in field_names(spec.config) if name not in field_names(HeadConfig)]
    assert list(head) == [*field_names(HeadConfig), *dict.fromkeys(own)] and all(head[name] is None for name in own)
    assert "depth" in own and head.lora.r == LORA_DEFAULTS["r"]
    with pytest.raises(Exception, match="head.k"):  # before the schema it composed and failed only when built
        composed(["head=parallel", "head.k=four"])
    with pytest.raises(Exception, match="head.share_depth_weights"):
        composed(["head=deepseek", "head.share_depth_weights=maybe"])
    with pytest.raises(ConfigError, match="depth"):
        head_config(OmegaConf.to_container(composed(["head=parallel", "head.depth=2"]).head))
    deepseek = head_config(OmegaConf.to_container(composed(["head=deepseek", "head.share_depth_weights=true"]).head))
    assert type(deepseek) is HEAD_SPECS["deepseek"].config and deepseek.share_depth_weights and deepseek.chain_state == "block_output"


def test_head_is_typed_by_the_head_it_names_not_by_the_group_option():
    """A cross-head sweep keeps the group option `ntp` and interpolates `head.name`, adding `head.depth: null`
    for every head: the registry's class of the head that runs types it, its own options at their defaults."""
    cfg = composed(["experiment=head_ablation", "variant=deepseek_k2", "hydra.mode=RUN"])
    head = OmegaConf.to_container(cfg.head, resolve=True)
    assert head["name"] == "deepseek" and head["depth"] is None
    typed = head_config(head)
    assert type(typed) is HEAD_SPECS["deepseek"].config and (typed.k, typed.depth) == (2, 1)
    assert typed.hidden_input == HEAD_SPECS["deepseek"].config.hidden_input  # null in the group: the class's default


def test_paths_are_strings_even_when_given_as_numbers():
    """Before the schema `paths.output_dir=3` composed as an int and the run crashed in pathlib with a traceback."""
    paths = composed(["paths.output_dir=3", "paths.cache_dir=7"]).paths
    assert (paths.output_dir, paths.cache_dir) == ("3", "7")


@pytest.mark.parametrize("option", ["corpus", "generated"])
def test_train_rows_compose_their_configs_fields_and_refuse_a_wrong_type(option):
    from lab.data.train_rows import TrainRowsConfig

    rows = OmegaConf.to_container(composed([f"train_rows={option}"]).train_rows, resolve=True)
    assert list(rows) == [f.name for f in dataclasses.fields(TrainRowsConfig)] and rows["source"] == option
    assert TrainRowsConfig(**rows).prompt_tokens == TrainRowsConfig().prompt_tokens  # the YAML restates no default
    with pytest.raises(Exception, match="temperature"):
        composed([f"train_rows={option}", "train_rows.temperature=hot"])

"""The typed schemas Hydra composes with (lab/config/schemas.py): each registered group's composed fields are
its object's dataclass fields, a wrong type is refused while composing, and `head` is typed by its builder
for the reason the schemas module states."""

import dataclasses

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lab.config.schemas import composable, fields_of
from lab.data import DataConfig, TASKS, check_data_config
from lab.data.synthetic import SyntheticConfig
from lab.model.heads import HEADS, head_config
from lab.model.hf_trunk import HFModelConfig
from lab.objective.weights import WEIGHT_SCHEDULES, build_weight_schedule, schedule_options
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


def test_head_is_typed_by_the_head_it_names_not_by_the_group_option():
    """A cross-head sweep keeps the group option `ntp` and interpolates `head.name`, adding `head.depth: null`
    for every head: the option's schema (HeadConfig) would refuse the field, the registry's class types it."""
    cfg = composed(["experiment=head_ablation", "variant=deepseek_k2", "hydra.mode=RUN"])
    head = OmegaConf.to_container(cfg.head, resolve=True)
    assert head["name"] == "deepseek" and head["depth"] is None
    option_schema = OmegaConf.structured(composable("HeadConfig", fields_of(HEADS["ntp"].config_class)))
    with pytest.raises(Exception, match="depth"):
        OmegaConf.merge(option_schema, head)
    typed = head_config(head)
    assert type(typed) is HEADS["deepseek"].config_class and (typed.k, typed.depth) == (2, 1)

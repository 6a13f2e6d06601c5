"""lab/schema.py: the one unknown-key check and the typed build of a group's dataclass."""

from dataclasses import dataclass

import pytest

from lab.errors import ConfigError
from lab.model.mtp import build_model
from lab.objective.objective import Objective
from lab.schema import check_known, did_you_mean, typed


@dataclass
class Shape:
    width: int = 2
    height: int = 3


def test_typed_fills_defaults_and_keeps_given_values():
    assert typed(Shape, {"height": 7}, "shape") == Shape(width=2, height=7)


def test_an_unknown_key_is_one_line_naming_the_group_key_with_the_allowed_ones():
    with pytest.raises(ConfigError) as error:
        typed(Shape, {"widht": 4}, "shape")
    assert str(error.value) == "shape.widht: not an option of the shape group (did you mean shape.width?); allowed: width, height"


def test_a_command_line_key_says_how_to_add_it():
    with pytest.raises(ConfigError) as error:
        check_known("trainer", ["max_step"], ["max_steps", "precision"])
    assert str(error.value) == "trainer.max_step: no such setting (did you mean trainer.max_steps?); to add a new key write +trainer.max_step=..."
    with pytest.raises(ConfigError, match=r"^sed: no such config group or setting; to add a new key write \+sed=\.\.\.$"):
        check_known("", ["sed"], ["seed_everything_else"])


def test_known_keys_pass_and_far_names_get_no_suggestion():
    check_known("shape", ["width"], ["width", "height"])
    assert did_you_mean("zzz", ["width", "height"]) == ""


@pytest.mark.parametrize("build, field", [
    (lambda: build_model({"vocab_size": 13, "d_modle": 32}, {"name": "ntp"}), "model.d_modle"),
    (lambda: build_model({"vocab_size": 13}, {"name": "parallel", "k": 2, "depth": 2}), "head.depth"),
    (lambda: Objective.build({"policy": "sum", "scope": "global"}, {"name": "uniform"}, {"name": "joint"}, k=2), "reduction.scope"),
    (lambda: Objective.build({"policy": "sum"}, {"name": "medusa", "gamma": 0.5}, {"name": "joint"}, k=2), "weights.gamma"),
])
def test_every_builder_refuses_an_unknown_key_through_the_same_check(build, field):
    with pytest.raises(ConfigError) as error:
        build()
    assert error.value.field == field and "not an option of" in error.value.message and "allowed: " in error.value.message

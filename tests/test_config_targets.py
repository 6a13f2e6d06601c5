"""The schema of a `_target_` node is its class's constructor (lab/config/target_nodes.py): keys are checked against
the signature (through a subclass that passes **kwargs on), scalars against the annotations."""

from __future__ import annotations

from typing import Literal

import pytest
from omegaconf import OmegaConf

from lab.config.target_nodes import check_target_node, constructor_arguments, scalar_problem
from lab.errors import ConfigError


class Base:
    def __init__(self, size: int, name: str | None = None, mode: Literal["a", "b"] = "a", scale: float = 1.0, items: list | None = None):
        pass


class PassesOn(Base):
    def __init__(self, flag: bool = False, **kwargs):
        super().__init__(**kwargs)


def node(**values):
    return OmegaConf.create({"_target_": f"{__name__}.PassesOn", **values})


def test_a_subclass_that_passes_kwargs_on_takes_its_bases_arguments():
    names, hints, takes_any = constructor_arguments(PassesOn)
    assert names == ["flag", "size", "name", "mode", "scale", "items"] and not takes_any
    assert hints["flag"] is bool and hints["size"] is int


@pytest.mark.parametrize("hint, value, problem", [
    (int, 3, None), (int, True, "must be an integer, got True"), (int, 2.5, "must be an integer, got 2.5"),
    (float, 3, None), (float, "x", "must be a number, got 'x'"),
    (str | None, None, None), (str | None, 3, "must be a string, got 3"), (str, None, "must not be null"),
    (Literal["a", "b"], "b", None), (Literal["a", "b"], "c", "must be 'a' or 'b', got 'c'"),
    (bool | Literal["all"], "all", None), (bool | Literal["all"], "some", "must be true or false or 'all', got 'some'"),
    (list | None, "anything", None),  # not built from scalars: the class decides
])
def test_scalar_values_against_annotations(hint, value, problem):
    assert scalar_problem(hint, value) == problem


def test_a_node_is_refused_naming_the_key():
    check_target_node("callbacks.x", node(size=3, flag=True, scale=2, items=[1]))  # fits
    with pytest.raises(ConfigError) as error:
        check_target_node("callbacks.x", node(size=3, sise=4))
    assert error.value.field == "callbacks.x.sise" and "did you mean callbacks.x.size" in str(error.value)
    with pytest.raises(ConfigError) as error:
        check_target_node("callbacks.x", node(size="three"))
    assert error.value.field == "callbacks.x.size" and "must be an integer" in str(error.value)
    with pytest.raises(ConfigError) as error:
        check_target_node("callbacks.x", OmegaConf.create({"_target_": "no.such.Class"}))
    assert error.value.field == "callbacks.x._target_"


def test_an_interpolation_is_left_to_the_class():
    check_target_node("callbacks.x", OmegaConf.create({"_target_": f"{__name__}.PassesOn", "size": "${oc.env:NOPE,3}"}))

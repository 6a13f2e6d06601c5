"""The value rule every config field shares (lab/errors.py, "value checks"): hand-listed values on each side of it, and the
fields that used to disagree now giving the same answer."""

import math

import numpy as np
import pytest

from lab.errors import ConfigError, interval, is_int, is_number, require_bool, require_int, require_number


@pytest.mark.parametrize("value, integer, number", [
    (3, True, True), (0, True, True), (-2, True, True), (np.int64(4), True, True),
    (2.0, False, True), (0.5, False, True), (np.float32(0.5), False, True),
    (True, False, False), (False, False, False),            # a bool is an int in Python, never a count or a rate here
    ("3", False, False), ("0.5", False, False),              # a quoted number is refused, not converted
    (math.inf, False, False), (math.nan, False, False), (None, False, False), ([1], False, False),
])
def test_one_rule_for_integers_and_numbers(value, integer, number):
    assert (is_int(value), is_number(value)) == (integer, number)


@pytest.mark.parametrize("kwargs, inside, outside, allowed", [
    ({"low": 0, "high": 1, "open_high": True}, [0, 0.999], [1, -0.1], "a number in [0, 1)"),
    ({"low": 0, "high": 1, "open_low": True, "open_high": True}, [0.5], [0, 1], "a number in (0, 1)"),
    ({"low": 0, "open_low": True}, [1e-9, 7], [0, -1], "a number > 0"),
    ({"low": 0}, [0, 3], [-1e-9], "a number ≥ 0"),
    ({"high": 2.5}, [2.5, -9], [2.6], "a number ≤ 2.5"),
    ({}, [-1e30, 1e30], ["1", True], "a number"),
])
def test_numbers_inside_an_interval_pass_and_the_message_states_it(kwargs, inside, outside, allowed):
    for value in inside:
        require_number(value, "x.y", **kwargs)
    for value in outside:
        with pytest.raises(ConfigError, match=rf"^x\.y: must be {allowed}, got {value!r}$".replace("(", r"\(").replace(")", r"\)")
                           .replace("[", r"\[").replace("+", r"\+")):
            require_number(value, "x.y", **kwargs)


def test_integers_with_a_least_value_and_null_where_optional():
    require_int(5, "data.batch_size", least=5)
    require_int(None, "data.max_docs", least=0, optional=True)
    require_int(-3, "data.seed")
    with pytest.raises(ConfigError, match=r"^data\.batch_size: must be an integer ≥ 1, got 0$"):
        require_int(0, "data.batch_size", least=1)
    with pytest.raises(ConfigError, match=r"^data\.max_docs: must be an integer ≥ 0 or null, got 2\.0$"):
        require_int(2.0, "data.max_docs", least=0, optional=True)
    with pytest.raises(ConfigError, match=r"^data\.seed: must be an integer, got None$"):
        require_int(None, "data.seed")
    with pytest.raises(ConfigError, match=r"^data\.shuffle: must be true or false, got 1$"):
        require_bool(1, "data.shuffle")


def test_interval_words():
    assert [interval(0, 1, False, True), interval(0, None, True, False), interval(None, None, False, False)] == [" in [0, 1)", " > 0", ""]


@pytest.mark.parametrize("build, field", [
    (lambda: __import__("lab.objective.weights", fromlist=["x"]).build_weight_schedule("geometric", 3, gamma="0.5"), "weights.gamma"),
    (lambda: __import__("lab.training.optim", fromlist=["x"]).OptimConfig(lr="0.5"), "optim.lr"),
    (lambda: __import__("lab.data.config", fromlist=["x"]).DataConfig(batch_size="4"), "data.batch_size"),
])
def test_a_quoted_number_is_refused_in_every_group(build, field):
    """The weight schedules used to convert "0.5" with float() while optim and data refused it."""
    with pytest.raises(ConfigError) as error:
        build()
    assert error.value.field == field and "'" in error.value.message

"""One error type for bad input, so the CLI can print a single line and exit non-zero; one for a run stopped by a
signal; and the value checks every config field uses, written once.

The value checks every config field uses, written once.

One rule for every field: a number is a Python (or NumPy) int or float, never a bool and never a string
that looks like a number ("0.5" from a quoted YAML value is refused, not converted), and it is finite.
An integer field also refuses floats (2.0 included): a count written as a float is usually a typo.
Each `require_*` raises ConfigError naming the field and what is allowed:
`data.batch_size: must be an integer ≥ 1, got 0`.
"""

import math
import signal
from numbers import Integral, Real
from typing import Any


class ConfigError(ValueError):
    """Bad config, data or checkpoint. `field` names the offending setting."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ConfigError(field, message)


# ---------------------------------------------------------------- value checks


def is_int(value: Any) -> bool:
    """An integer that is not a bool (True is an int in Python; as a count it is a mistake)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def require_bool(value: Any, field: str) -> None:
    require(isinstance(value, bool), field, f"must be true or false, got {value!r}")


def require_int(value: Any, field: str, *, least: int | None = None, optional: bool = False) -> None:
    """An integer ≥ `least` (any integer when None); null too when `optional`."""
    if optional and value is None:
        return
    bound = "" if least is None else f" ≥ {least}"
    allowed = f"an integer{bound}" + (" or null" if optional else "")
    require(is_int(value) and (least is None or value >= least), field, f"must be {allowed}, got {value!r}")


def require_number(value: Any, field: str, *, low: float | None = None, high: float | None = None,
                   open_low: bool = False, open_high: bool = False, optional: bool = False) -> None:
    """A finite number in the interval [low, high] (ends open where asked, unbounded where None); null too when `optional`."""
    if optional and value is None:
        return
    inside = is_number(value) and (low is None or (value > low if open_low else value >= low)) \
        and (high is None or (value < high if open_high else value <= high))
    allowed = "a number" + interval(low, high, open_low, open_high) + (" or null" if optional else "")
    require(inside, field, f"must be {allowed}, got {value!r}")


def interval(low: float | None, high: float | None, open_low: bool, open_high: bool) -> str:
    """' in [0, 1)', ' > 0', ' ≥ 0', ' ≤ 1' or '' (no bound)."""
    if low is not None and high is not None:
        return f" in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    if low is not None:
        return f" {'>' if open_low else '≥'} {low:g}"
    if high is not None:
        return f" {'<' if open_high else '≤'} {high:g}"
    return ""


class RunInterrupted(Exception):
    """Training stopped by `signum` after `step` optimizer steps."""

    def __init__(self, signum: int, step: int):
        self.signum, self.step = int(signum), int(step)
        super().__init__(f"stopped by {signal.Signals(self.signum).name} at step {self.step}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

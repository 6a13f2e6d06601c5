"""The head cases the tests run over, generated from the head registry (`lab.model.heads.HEAD_SPECS`).

`case(name)` is an architecture's example config, as its `HeadSpec.example` gives it: its name, its K
(`EXAMPLE_K` unless the spec fixes one: the baseline's is 1) and the fields its own config derives
from K (DeepSeek's `depth` = K - 1). `cases()` is
every registered architecture's example, in registry order, so a table built from it covers an
architecture the moment it is registered; a test file adds its variants (`case("linear",
unembedding="replicated")`) under names of its own. `overrides(...)` gives a case as the CLI's
`head=...` overrides.
"""

from __future__ import annotations

from lab.model.heads import HEAD_SPECS, head_spec

HEAD_NAMES = tuple(HEAD_SPECS)  # the shipped heads (a head a test registers later is not among them)
EXAMPLE_K = 3  # three horizons: a first, a middle and a last one


def case(name: str, k: int | None = None, **options) -> dict:
    """Head `name`'s example at K = `k` (default `EXAMPLE_K`; a spec may fix its own) and `options` on top."""
    return {**head_spec(name).example(EXAMPLE_K if k is None else k), **options}


def cases(*names: str, k: int | None = None, **options) -> dict[str, dict]:
    """`{name: case(name, k, **options)}` for `names`, or for every registered head when none are given."""
    return {name: case(name, k, **options) for name in names or HEAD_NAMES}


def without(*names: str, k: int | None = None, **options) -> dict[str, dict]:
    """Every registered head's case except `names` (those a test cannot run, each file saying why)."""
    return cases(*(name for name in HEAD_NAMES if name not in names), k=k, **options)


def overrides(head: dict) -> list[str]:
    """A case as `lab-train` overrides: `head=<name>` and one `head.<field>=<value>` per other field."""
    return [f"head={head['name']}", *(f"head.{key}={value}" for key, value in head.items() if key != "name")]


def split(head: dict) -> tuple[str, int, dict]:
    """A case as (name, K, the other fields)."""
    rest = {key: value for key, value in head.items() if key not in ("name", "k")}
    return head["name"], head["k"], rest

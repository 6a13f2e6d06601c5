"""`model.compile=true`: torch.compile the transformer units of trunk and heads, in place.

The units are those FSDP shards (lab/training/sharding.py): every trunk block, every head block and
every DeepSeek depth module (compiled whole, its block inside it). Compiling per unit, not
the whole network: blocks of one shape share one compiled graph (torch inlines module
parameters as graph inputs), so a 12-layer trunk compiles once, not twelve times; the
embedding lookup, the masks and the vocabulary projections of the backward schedules stay
eager, and each schedule's own backward order is untouched.
"""

from __future__ import annotations

import torch.nn as nn

from lab.model.heads import sharding_units
from lab.errors import require_bool


def split_compile_option(model: dict) -> tuple[dict, bool]:
    """The `model` group without `compile` (how to run the network, not what it is: not in the manifest), and its value."""
    model = dict(model)
    compiled = model.pop("compile", False)
    require_bool(compiled, "model.compile")
    return model, compiled


def compile_units(model: nn.Module, **options) -> list[nn.Module]:
    """`module.compile(**options)` on every outermost unit of `model`; returns the compiled modules."""
    compiled = []

    def visit(module: nn.Module) -> None:
        if isinstance(module, tuple(sharding_units())):
            module.compile(**options)
            compiled.append(module)
            return  # a unit's sub-units run inside its compiled graph
        for child in module.children():
            visit(child)

    visit(model)
    return compiled

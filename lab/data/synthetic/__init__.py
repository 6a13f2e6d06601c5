"""Synthetic tasks with a prompt and an answer: path-star graphs and induction (`data=star_graph|induction`)."""

import importlib

from lab.data.synthetic.config import LOSS_ON, TASKS, SyntheticConfig, validate_synthetic_config
from lab.data.synthetic.example import Example
from lab.data.synthetic.induction import InductionTask
from lab.data.synthetic.star_graph import StarGraphTask

# Imported on first use (PEP 562): the DataModule loads Lightning; the configs above stay light.
_LAZY = ("SyntheticDataModule", "generate_examples", "pack_examples")


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'lab.data.synthetic' has no attribute {name!r}")
    value = getattr(importlib.import_module("lab.data.synthetic.datamodule"), name)
    globals()[name] = value
    return value


__all__ = [
    "Example",
    "InductionTask",
    "LOSS_ON",
    "StarGraphTask",
    "SyntheticConfig",
    "SyntheticDataModule",
    "TASKS",
    "generate_examples",
    "pack_examples",
    "validate_synthetic_config",
]

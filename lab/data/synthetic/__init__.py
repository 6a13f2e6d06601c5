"""Synthetic tasks with a prompt and an answer: path-star graphs and induction (`data=star_graph|induction`)."""

from lab.data.synthetic.datamodule import (
    LOSS_ON,
    TASKS,
    SyntheticConfig,
    SyntheticDataModule,
    generate_examples,
    pack_examples,
    validate_synthetic_config,
)
from lab.data.synthetic.example import Example
from lab.data.synthetic.induction import InductionTask
from lab.data.synthetic.star_graph import StarGraphTask, parse_star_graph

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
    "parse_star_graph",
    "validate_synthetic_config",
]

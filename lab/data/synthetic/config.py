"""The `data` group of a synthetic task: the fields every task shares (`SyntheticConfig`), the task
registry (`TASKS`) and their checks. Light to import, so the config schemas Hydra composes with
(lab/config/hydra_schemas.py) can read it without loading the DataModules' libraries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lab.errors import require, require_bool, require_int
from lab.data.synthetic.induction import InductionTask
from lab.data.synthetic.star_graph import StarGraphTask
from lab.schema import check_known

TASKS = {"star_graph": StarGraphTask, "induction": InductionTask}
# Which tokens of an example may be a label: (prompt length, answer length) -> [len + 1] bools, EOS last.
LOSS_ON: dict[str, Callable[[int, int], list[bool]]] = {
    "answer": lambda prompt, answer: [False] * prompt + [True] * answer + [False],
    "all": lambda prompt, answer: [True] * (prompt + answer + 1),
}


@dataclass(frozen=True)
class SyntheticConfig:
    source: str
    task: StarGraphTask | InductionTask
    seq_len: int = 128
    batch_size: int = 32
    train_examples: int = 10_000
    val_examples: int = 256
    seed: int = 0
    loss_on: str = "answer"
    max_val_rows: int | None = None
    answer_examples: int = 64  # val examples the answer-accuracy callback decodes (lab/callbacks/answer_accuracy.py)
    shuffle: bool = True
    num_workers: int = 0
    teacherless: bool = False  # `objective.teacherless` (conf/data/<task>.yaml interpolates it): add `input_tokens`

    def __post_init__(self) -> None:
        """The fields every task shares, checked at construction (the task's own fields: at its construction)."""
        from lab.data.packing import check_seq_len  # reads corpora: imported when a config is built
        check_seq_len(self.seq_len)
        for name, minimum in (("batch_size", 1), ("train_examples", 1), ("val_examples", 1), ("answer_examples", 0), ("num_workers", 0)):
            require_int(getattr(self, name), f"data.{name}", least=minimum)
        require_int(self.seed, "data.seed")
        require_int(self.max_val_rows, "data.max_val_rows", least=1, optional=True)
        require(self.loss_on in LOSS_ON, "data.loss_on", f"unknown {self.loss_on!r}; allowed: {', '.join(LOSS_ON)}")
        require_bool(self.shuffle, "data.shuffle")
        require_bool(self.teacherless, "objective.teacherless")
        require(not self.teacherless or self.loss_on == "answer", "objective.teacherless",
                f"needs data.loss_on=answer (a teacherless model is trained on the answer only), got data.loss_on={self.loss_on}")
        length = example_tokens(self.task)
        require(self.seq_len >= length, "data.seq_len",
                f"must be ≥ {length}, the tokens of one {self.source} example (EOS included); got {self.seq_len}")

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "task"}
        return {**out, **dataclasses.asdict(self.task)}


def validate_synthetic_config(**options) -> SyntheticConfig:
    """The `data` group of a synthetic task (`source` names it): the task's fields plus the common ones."""
    source = options.get("source")
    require(source in TASKS, "data.source", f"unknown synthetic task {source!r}; allowed: {', '.join(TASKS)}")
    task_cls = TASKS[source]
    task_fields = [f.name for f in dataclasses.fields(task_cls)]
    common = [f.name for f in dataclasses.fields(SyntheticConfig) if f.name != "task"]
    check_known("data", options, common + task_fields, owner=f"data.source={source}")
    task = task_cls(**{name: options[name] for name in task_fields if name in options})
    return SyntheticConfig(task=task, **{name: options[name] for name in common if name in options})


def example_tokens(task) -> int:
    """Tokens of one document (prompt, answer, EOS); every example of a task has this length."""
    return len(task.sample(np.random.default_rng(0))) + 1

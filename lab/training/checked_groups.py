"""The typed config groups the start-up checks made, handed to the build so each is typed once per build."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lab.model.heads import HeadConfig
    from lab.objective.objective import Objective
    from lab.data.train_rows import TrainRowsConfig
    from lab.training.optim import OptimConfig


@dataclass(frozen=True)
class CheckedGroups:
    """The typed groups `check_config` made, which the build uses as they are (each typed once per build).
    `model` and `data` are typed again by the build: their final values (the tokenizer's vocabulary, a
    pretrained model's tokenizer) are known only once the tokenizer is."""

    head: HeadConfig  # the config_class of the head `head.name` names
    optim: OptimConfig
    objective: Objective  # reduction, weights, schedule and targets
    train_rows: TrainRowsConfig | None = None  # None: the corpus's own rows

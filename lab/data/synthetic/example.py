"""One synthetic example: a prompt, the answer a model must generate after it, and its identity."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, fields
from typing import ClassVar

from lab.errors import require_int


@dataclass(frozen=True)
class Example:
    prompt: tuple[str, ...]  # symbols the model is given
    answer: tuple[str, ...]  # symbols it must produce next (greedy decoding is scored on these)
    key: Hashable  # equal keys are the same problem: a val key never occurs in train

    def __len__(self) -> int:
        return len(self.prompt) + len(self.answer)


def require_positive_fields(task) -> None:
    """Every field of a task is a count: an integer ≥ 1 (before the task's own bounds compare them)."""
    for field in fields(task):
        require_int(getattr(task, field.name), f"data.{field.name}", least=1)


class AnswerTask:
    """What every synthetic task shares (a frozen dataclass subclasses it): its fields are counts, checked at
    construction before the task's own bounds (`check_bounds`, naming `data.<field>`); its answers have one
    decision token (`decision_index`) that a model which never learned the task guesses among `decision_choices`."""

    decision_index: ClassVar[int] = 0

    def __post_init__(self) -> None:
        require_positive_fields(self)
        self.check_bounds()

    def check_bounds(self) -> None:
        """The task's own cross-field bounds."""

    @property
    def decision_choices(self) -> int:
        raise NotImplementedError

    @property
    def decision_chance(self) -> float:
        return 1 / self.decision_choices

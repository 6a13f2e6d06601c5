"""One synthetic example: a prompt, the answer a model must generate after it, and its identity."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, fields

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

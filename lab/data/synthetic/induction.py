"""Induction (copy a repeated span): random tokens, then the span again after a marker.

An example, as symbols: `span filler = span`. The span (`span_len` random symbols of
`num_symbols`) and the filler are drawn uniformly; token i of the second occurrence stands
`distance` positions after token i of the first (so the filler has distance − span_len − 1
symbols). The prompt ends with the marker `=`, the answer is the second occurrence: with
`data.loss_on=answer` only it is supervised, and every answer token equals the token
`distance` positions earlier — a prediction only an induction (look-back-and-copy)
mechanism can make.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lab.data.synthetic.example import AnswerTask, Example
from lab.errors import require

MARKER = "="


@dataclass(frozen=True)
class InductionTask(AnswerTask):
    num_symbols: int = 32
    span_len: int = 8
    distance: int = 24

    # The decision of an answer: its first token, the first copied symbol (a guess is right with 1/num_symbols).
    decision_index = 0

    @property
    def decision_choices(self) -> int:
        return self.num_symbols

    def check_bounds(self) -> None:
        require(self.num_symbols >= 2, "data.num_symbols", f"must be an integer ≥ 2, got {self.num_symbols!r}")
        require(self.span_len >= 1, "data.span_len", f"must be an integer ≥ 1, got {self.span_len!r}")
        require(
            self.distance >= self.span_len + 1,
            "data.distance",
            f"must be ≥ span_len + 1 = {self.span_len + 1} (the second occurrence starts after the first and the marker), got {self.distance!r}",
        )

    def symbols(self) -> list[str]:
        return [str(symbol) for symbol in range(self.num_symbols)] + [MARKER]

    def sample(self, rng: np.random.Generator) -> Example:
        span = rng.integers(self.num_symbols, size=self.span_len).tolist()  # [span_len]
        filler = rng.integers(self.num_symbols, size=self.distance - self.span_len - 1).tolist()  # [distance − span_len − 1]
        prompt = tuple(str(s) for s in [*span, *filler]) + (MARKER,)
        return Example(prompt=prompt, answer=tuple(str(s) for s in span), key=prompt)

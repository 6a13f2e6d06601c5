"""`train_rows`: where a run's training rows come from (the generation itself: lab/decode/generated_rows.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from lab.errors import require

RowSource = Literal["corpus", "generated"]
ROW_SOURCES = get_args(RowSource)


@dataclass
class TrainRowsConfig:
    """`train_rows`: where training rows come from. corpus: the packed corpus; generated: the model continues each."""

    source: RowSource = "corpus"
    prompt_tokens: int = 32  # of each corpus row kept as the prompt; the model writes the other seq_len - prompt_tokens
    temperature: float = 1.0  # of the model's sampling (0: greedy); 1 matches decoding at T=1
    batch_size: int = 32  # rows continued together (one batched decoding pass each)
    seed: int | None = None  # the rows' sampling seed; null: the run's `seed` (set it to train other seeds on the same rows)

    def __post_init__(self) -> None:
        require(self.source in ROW_SOURCES, "train_rows.source", f"must be one of {', '.join(ROW_SOURCES)}, got {self.source!r}")
        require(isinstance(self.prompt_tokens, int) and self.prompt_tokens >= 1, "train_rows.prompt_tokens",
                f"must be an integer ≥ 1, got {self.prompt_tokens!r}")
        require(isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature) and self.temperature >= 0,
                "train_rows.temperature", f"must be a finite number ≥ 0 (0: greedy), got {self.temperature!r}")
        require(isinstance(self.batch_size, int) and self.batch_size >= 1, "train_rows.batch_size",
                f"must be an integer ≥ 1, got {self.batch_size!r}")
        require(self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0),
                "train_rows.seed", f"must be an integer ≥ 0, or null for the run's seed, got {self.seed!r}")

    def sampling_seed(self, run_seed: int) -> int:
        """The seed the rows are sampled with: `seed` when set, else the run's."""
        return int(run_seed if self.seed is None else self.seed)

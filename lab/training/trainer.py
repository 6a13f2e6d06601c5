"""Lightning's Trainer with one more setting the `trainer` group carries: `threads` (lab/training/threads.py).

The harness applies it when the model is built (lab/train.py), before any data is tokenised or any row
generated; the Trainer only keeps it, so the group's typed schema (its constructor) states and checks it.
"""

from __future__ import annotations

from typing import Literal

import pytorch_lightning as pl

from lab.training.threads import AUTO, check_threads


class Trainer(pl.Trainer):
    def __init__(self, *, threads: int | Literal["auto"] = AUTO, **kwargs):
        check_threads(threads)
        self.threads = threads
        super().__init__(**kwargs)

"""`lab-generate --draft-vocab N`: heads trained on the full vocabulary draft over the N most frequent ids of
the run's own training data (restricting only at draft time, as FR-Spec does). The counts come from the
run's recorded `data` and `model` config (run.json), so the source must be a run directory or one of its
checkpoints; verification keeps the full vocabulary, so the output is unchanged under greedy decoding.
"""

from __future__ import annotations

import json
from pathlib import Path

from lab.errors import require
from lab.nn.draft_vocab import most_frequent_ids, training_token_counts

FIELD = "--draft-vocab"


def run_dir_of(source: str) -> Path | None:
    """The run directory holding `source` (a run dir, or a checkpoint under its checkpoints/), if any."""
    path = Path(source)
    for candidate in (path, path.parent.parent):
        if (candidate / "run.json").is_file():
            return candidate
    return None


def apply_draft_vocab(model, source: str, n: int) -> float:
    """Set the model's draft ids from the run's training token counts; returns the share of training tokens covered."""
    vocab = model.trunk.unembedding.shape[0]
    require(model.k >= 2, FIELD, f"restricts the draft heads, and this model has K={model.k}: none")
    require(1 <= n <= vocab, FIELD, f"must be an integer 1 ≤ N ≤ {vocab} (the vocabulary size), got {n}")
    if model.draft_ids is not None:
        require(model.draft_ids.numel() == n, FIELD, f"these heads were trained over a draft vocabulary of {model.draft_ids.numel()} ids; "
                f"use that size (or leave {FIELD} out)")
        return float("nan")
    run_dir = run_dir_of(source)
    require(run_dir is not None, FIELD, f"counts the run's training tokens: give its run directory or a checkpoint under it, not {source}")
    config = json.loads((run_dir / "run.json").read_text()).get("config") or {}
    require(bool(config.get("data")) and bool(config.get("model")), FIELD, f"{run_dir}/run.json records no data/model config to count tokens from")
    from lab.training.run_data import run_datamodule

    datamodule = run_datamodule(config["data"], config["model"])
    datamodule.setup("fit")
    counts = training_token_counts(datamodule.train_rows, vocab)  # [V]
    ids = most_frequent_ids(counts, n)
    model.set_draft_ids(ids)
    return float(counts[ids].sum()) / max(1, int(counts.sum()))

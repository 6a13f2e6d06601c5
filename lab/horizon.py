"""A head's contract: the trunk parts it is handed (`SharedParts`) and what it gives the objective, one `Horizon`
per predicted distance (the rows that predict it and how they are scored). Heads build horizons; the objective
(lab/objective) scores them and attaches a `Teacher` for distilled targets. Below both, so neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from lab.labels import horizon_mask


@dataclass
class Teacher:
    """Self-distillation target of one horizon: the next-token path's rows that predict the same tokens."""

    rows: torch.Tensor  # [B, S-o, d] detached horizon-1 rows t+o-1 (before the final norm)
    norm_weight: torch.Tensor  # [d] detached final-norm weight of horizon 1
    norm: nn.Module  # the final norm, an RMSNorm (its `normalize` takes the detached weight)
    weight: torch.Tensor  # [V, d] detached horizon-1 projection
    ce_weight: float  # the data label's share of the per-row loss
    divergence: str  # the divergence from the teacher's distribution (lab/objective/targets.py: DIVERGENCES)
    divergence_weight: float  # its share
    eta: float = 3.0  # lk_hybrid's λ = exp(−η·α)


@dataclass
class KnownRows:
    """A horizon's per-row loss and top-1 hit, known before the step (`MTPModel.with_known_next_token`).

    Horizon 1 of a head that keeps the trunk's own next-token path scores the same at every step while the
    trunk is frozen, so the hidden-state cache stores it once and the backward schedule sums it under the
    horizon's mask instead of building its V-wide logits (lab/objective/backward.py: `known_stats`).
    """

    row_loss: torch.Tensor  # [B, S-k] the cross-entropy of every row, in the loss dtype
    row_hit: torch.Tensor  # [B, S-k] bool: the label was the top-1 logit


@dataclass
class Horizon:
    """One horizon's supervision, aligned to source rows t = 0 .. S-k-1."""

    k: int
    hidden: torch.Tensor  # [B, S-k, d] rows before the final norm
    labels: torch.Tensor  # [B, S-k] long: tokens[t+k]
    mask: torch.Tensor  # [B, S-k] bool: which rows are supervised
    norm: nn.Module  # the final norm (an RMSNorm) applied before the projection
    weight: torch.Tensor  # [V, d] projection to the vocabulary
    offset: int | None = None  # the token distance predicted (tokens[t+offset]); None: k
    teacher: Teacher | None = None  # set by the objective for distilled targets (training only)
    vocab_ids: torch.Tensor | None = None  # [N] the draft vocabulary `weight` and `labels` index (head.draft_vocab); None: all V
    draft_coverage: torch.Tensor | None = None  # [2] (supervised targets inside the draft vocabulary, all supervised targets)
    known: KnownRows | None = None  # the rows' loss and hits when no step can change them (no logits are built)

    def __post_init__(self) -> None:
        if self.offset is None:
            self.offset = self.k


@dataclass
class SharedParts:
    """Trunk-owned modules a head may use; passed at call time so they are never copied."""

    embed: nn.Embedding
    final_norm: nn.Module  # the trunk's RMSNorm
    unembedding: nn.Parameter  # [V, d]
    draft_ids: torch.Tensor | None = None  # [N] the draft vocabulary (head.draft_vocab) horizons ≥ 2 choose from; None: all V


def endpoint_horizon(k: int, rows: torch.Tensor, batch: dict, norm: nn.Module, weight: torch.Tensor, offset: int | None = None) -> Horizon:
    """Package full-length rows [B, S, d] as horizon k predicting tokens[t + offset] (default offset k), endpoint rule."""
    offset = k if offset is None else offset
    seq_len = rows.shape[1]
    return Horizon(
        k=k,
        hidden=rows[:, : seq_len - offset],  # [B, S-o, d]: source rows that have a target
        labels=batch["tokens"][:, offset:],  # [B, S-o]: tokens[t+o]
        mask=horizon_mask(batch["active"], batch["segment_ids"], offset, batch.get("target_mask")),  # [B, S-o]
        norm=norm,
        weight=weight,
        offset=offset,
    )

"""A draft vocabulary: horizons k ≥ 2 predict over the N most frequent training tokens only.

`head.draft_vocab` (null, the default: the full vocabulary; or an integer 1 ≤ N ≤ V) restricts the
heads' future horizons to N token ids chosen once, before training, from the training split's token
counts (most frequent first, ties broken by the smaller id). Horizon 1 — the next-token path, which
also verifies drafts — always keeps the full vocabulary, so decoding stays exact: a token outside the
set is simply never drafted.

In training a horizon k ≥ 2 projects onto the N rows `weight[ids]` of its projection; its labels are
remapped id -> index in the set, and a target outside the set is not supervised (the row leaves the
horizon's mask, so it counts in neither the loss nor N_k). A distilled teacher is restricted to the
same N ids and renormalised over them. In decoding the N logits are scattered back into a V-wide row
at `ids`, every other id at −inf: greedy never picks one, and the draft law q is zero there.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from lab.errors import is_int, require

FIELD = "head.draft_vocab"
ALLOWED = "null (the full vocabulary) or an integer 1 ≤ N ≤ the vocabulary size"


def check_draft_vocab(value, vocab_size: int | None = None, k: int | None = None) -> None:
    """The option's one check: null, or an integer in [1, V]; and a head with horizons ≥ 2 to restrict."""
    if value is None:
        return
    require(is_int(value) and value >= 1, FIELD, f"must be {ALLOWED}, got {value!r}")
    if vocab_size is not None:
        require(value <= vocab_size, FIELD, f"must be {ALLOWED} ({vocab_size}), got {value}")
    if k is not None:
        require(k >= 2, FIELD, f"restricts horizons ≥ 2 and head.k={k} has none; allowed here: null")


def training_token_counts(rows, vocab_size: int) -> torch.Tensor:
    """[V] int64: how often each id occurs among the active tokens of the packed training rows."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for index in range(len(rows)):
        row = rows[index]
        tokens = row["tokens"][row["active"].bool()]  # [n] the row's real tokens (no padding)
        counts += torch.bincount(tokens.long(), minlength=vocab_size)[:vocab_size]
    return counts


def most_frequent_ids(counts: torch.Tensor, n: int) -> torch.Tensor:
    """[N] long: the n most frequent ids, most frequent first; equal counts go to the smaller id."""
    order = torch.sort(-counts.to(torch.int64), stable=True).indices  # [V]: a stable sort keeps ids ascending within a tie
    return order[:n].clone()


def index_of(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] long: id -> its index in `ids`, −100 (ignored) for an id outside the set."""
    table = torch.full((vocab_size,), -100, dtype=torch.long, device=ids.device)
    table[ids] = torch.arange(ids.numel(), device=ids.device)
    return table


def restrict_horizon(horizon, ids: torch.Tensor, table: torch.Tensor):
    """One horizon k ≥ 2 over the draft vocabulary: weight [N, d], labels as indices, out-of-set targets unsupervised."""
    labels = table[horizon.labels]  # [B, S-o]: index in the set, −100 outside
    mask = horizon.mask & (labels >= 0)  # [B, S-o]
    return dataclasses.replace(
        horizon,
        weight=horizon.weight[ids],  # [N, d]: the projection's rows of the draft ids
        labels=labels.clamp_min(0),  # [B, S-o]: any valid index where the mask drops the row (never read there)
        mask=mask,
        vocab_ids=ids,
        draft_coverage=torch.stack([mask.sum(), horizon.mask.sum()]),  # [2]
    )


def scatter_to_vocab(logits: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., N] draft logits -> [..., V]: each at its id, −inf elsewhere (never proposed, zero probability)."""
    full = logits.new_full((*logits.shape[:-1], vocab_size), float("-inf"))  # [..., V]
    full[..., ids] = logits
    return full


def draft_rows_of(weight: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """[V, d] projection -> its [N, d] draft-vocabulary rows (a copy), or itself under the full vocabulary.
    Decoders take it once per request: the gather copies N × d numbers, too many to repeat at every draft."""
    return weight if ids is None else weight[ids]  # [N, d]


def draft_logits(normed: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """[..., d] normed rows, [V, d] projection -> [..., V] logits, projected on the draft rows only when `ids` is set."""
    return logits_on_rows(normed, draft_rows_of(weight, ids), ids, weight.shape[0])  # [..., V]


def logits_on_rows(normed: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """[..., d] normed rows, `draft_rows_of` a projection ([N, d], or [V, d] when `ids` is None) -> [..., V] logits."""
    logits = F.linear(normed, rows)  # [..., N or V]
    return logits if ids is None else scatter_to_vocab(logits, ids, vocab_size)  # [..., V]


def choose_draft_vocab(model, train_rows) -> dict | None:
    """Fill `model.draft_ids` from the training rows' token counts (nothing under the full vocabulary);
    returns what the run record keeps: the size and the share of training tokens the set covers."""
    if model.draft_ids is None:
        return None
    counts = training_token_counts(train_rows, model.trunk.unembedding.shape[0])  # [V]
    ids = most_frequent_ids(counts, model.draft_ids.numel())  # [N]
    model.set_draft_ids(ids)
    covered = float(counts[ids].sum()) / max(1, int(counts.sum()))
    print(f"draft vocabulary: the {ids.numel()} most frequent training tokens cover {covered:.1%} of them", flush=True)
    return {"size": ids.numel(), "train_token_coverage": round(covered, 6)}

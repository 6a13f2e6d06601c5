"""The label compiler: which (source row, horizon) pairs are supervised.

Two rules, both in docs/tensor-conventions.md:
- endpoint rule (independent heads): row t is valid at a horizon of offset o when both t
  and t+o are real tokens of the same document occurrence (o = k by default; leap offsets,
  `head.offsets`, give horizon k its own o_k);
- interval rule (DeepSeek chain): depth d's state at row t needs every token
  t..t+d real and in t's occurrence, because each depth consumed one of them.

`target_mask` (optional, [B, S] bool; the batch key of the same name) marks the tokens that may
be a label. False keeps a token active — attention context and chain input — but never a
target, at any horizon and in every head: `data.loss_on=answer` supervises only the answers of
a synthetic task (lab/data/synthetic) this way. Left out, every active token may be a target.
"""

from __future__ import annotations

import torch

from lab.errors import ConfigError


def _check(active: torch.Tensor, segment_ids: torch.Tensor, k: int, name: str) -> None:
    if active.dim() != 2 or active.shape != segment_ids.shape:
        raise ConfigError("labels", f"active and segment_ids must both be [B, S], got {tuple(active.shape)} and {tuple(segment_ids.shape)}")
    if active.dtype != torch.bool:
        raise ConfigError("labels", f"active must be a bool tensor, got {active.dtype}")
    seq_len = active.shape[1]
    if not 1 <= k < seq_len:
        raise ConfigError(name, f"must satisfy 1 ≤ {name} < seq_len={seq_len}, got {k}")


def _check_target_mask(active: torch.Tensor, target_mask: torch.Tensor | None) -> None:
    if target_mask is not None and (target_mask.shape != active.shape or target_mask.dtype != torch.bool):
        raise ConfigError("labels", f"target_mask must be a bool [B, S] tensor like active, got {target_mask.dtype} {tuple(target_mask.shape)}")


def horizon_mask(active: torch.Tensor, segment_ids: torch.Tensor, k: int, target_mask: torch.Tensor | None = None) -> torch.Tensor:
    """[B, S] -> [B, S-k] bool: source row t may be trained to predict token t+k (k: the horizon's offset).

    Only the endpoints count: a hole strictly between t and t+k does not break the pair.
    """
    _check(active, segment_ids, k, "k")
    _check_target_mask(active, target_mask)
    same_doc = segment_ids[:, :-k] == segment_ids[:, k:]  # [B, S-k]: source t vs target t+k
    mask = active[:, :-k] & active[:, k:] & same_doc  # [B, S-k]
    return mask if target_mask is None else mask & target_mask[:, k:]  # [B, S-k]: the target t+k may be a label


def chain_masks(
    active: torch.Tensor, segment_ids: torch.Tensor, depth: int, target_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Support of DeepSeek depth `depth` (≥ 1).

    Returns (state [B, S-depth], loss [B, S-depth-1]). state[b, t]: tokens t..t+depth are all
    active and in t's occurrence (the module at this depth has a well-defined input).
    loss[b, t]: state holds and the label token t+depth+1 is active and in the same occurrence
    (and, with `target_mask`, may be a label; the state never depends on it).
    """
    _check(active, segment_ids, depth, "depth")
    _check_target_mask(active, target_mask)
    S = active.shape[1]
    base_segment = segment_ids[:, : S - depth]  # [B, S-depth]
    state = active[:, : S - depth].clone()  # [B, S-depth]
    for offset in range(1, depth + 1):
        window_token = slice(offset, S - depth + offset)  # token t+offset for t in [0, S-depth)
        state &= active[:, window_token] & (segment_ids[:, window_token] == base_segment)  # [B, S-depth]
    label = slice(depth + 1, S)  # token t+depth+1 for t in [0, S-depth-1)
    loss = state[:, :-1] & active[:, label] & (segment_ids[:, label] == base_segment[:, :-1])  # [B, S-depth-1]
    if target_mask is not None:
        loss = loss & target_mask[:, label]  # [B, S-depth-1]
    return state, loss

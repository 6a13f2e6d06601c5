"""Training FLOPs per token: the matrix-multiplication work of one forward + backward.

What is counted, as the model computes it (dense over the rows each layer runs on):

- a transformer block on R rows: 2·R·(4 + 2·mlp_ratio)·d² for the q/k/v, attention-output and
  MLP matmuls, plus 2·2·R²·d for attention scores and mixing (SDPA runs over the full R×R
  mask; causality and document boundaries are masked, not skipped);
- the head's own layers (`MTPHead.forward_flops`): head blocks (and blocks recomputed for a
  detached trunk), the linear head's d×d maps, DeepSeek's 2d→d projections (depth d on S-d rows);
- the K projections to the vocabulary: horizon k's S-o_k rows (o_k = k unless `head.offsets`), 2·(S-o_k)·d·V each.

Not counted: norms, activations, softmax, cross-entropy and embedding lookups (no matmul).
This is what `torch.utils.flop_counter.FlopCounterMode` counts on the forward (the tests check
it). The backward is taken as 2 × the forward (input and weight gradients), so a training
step costs 3 × the forward; per token = per sequence / seq_len. For MFU:
`training_flops_per_token(model, S) * tokens_per_s / peak_flops_per_s`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # heads import this file, so it never imports the model (no cycle)
    from lab.nn.blocks import ModelConfig

BACKWARD_OVER_FORWARD = 2


def block_forward_flops(cfg: ModelConfig, rows: int) -> int:
    """One transformer block on `rows` rows of one sequence."""
    d = cfg.d_model
    matmuls = 2 * rows * (4 + 2 * cfg.mlp_ratio) * d * d  # qkv 3d², out d², MLP 2·ratio·d²
    attention = 2 * 2 * rows * rows * d  # QKᵀ and PV over every head
    return matmuls + attention


def forward_flops_per_sequence(model, seq_len: int) -> int:
    """Forward matmul FLOPs of an `MTPModel`'s trunk, head and K vocabulary projections for one sequence."""
    cfg = model.trunk.cfg  # the GPT's config, or the one a HF trunk's width and vocabulary give
    trunk_flops = getattr(model.trunk, "forward_flops", None)  # a HF trunk counts its own layers
    trunk = trunk_flops(seq_len) if trunk_flops is not None else len(model.trunk.blocks) * block_forward_flops(cfg, seq_len)
    projections = sum(2 * (seq_len - o) * cfg.d_model * cfg.vocab_size for o in model.head.offsets)  # [S-o_k, d] @ [d, V]
    return trunk + model.head.forward_flops(seq_len, cfg) + projections


def training_flops_per_token(model, seq_len: int) -> float:
    """Forward + backward matmul FLOPs per token of a `seq_len`-token training sequence."""
    return (1 + BACKWARD_OVER_FORWARD) * forward_flops_per_sequence(model, seq_len) / seq_len

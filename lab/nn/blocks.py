"""The GPT's building blocks, one readable file in the nanoGPT spirit: its config, RMSNorm, rotary positions
driven by `position_ids` (they restart at every document), SDPA attention with a boolean mask that never
crosses a document occurrence, a GELU MLP, and the pre-norm block the trunk and the block heads stack.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from lab.errors import require


@dataclass
class ModelConfig:
    vocab_size: int | None = 259  # the byte tokenizer's; None (the `model` group's default): the tokenizer's size
    d_model: int = 128
    n_layers: int = 6  # compute_match=blocks: every head option (K=4 block heads included) keeps ≥ 2 trunk blocks
    n_heads: int = 4
    mlp_ratio: int = 4
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    init_std: float = 0.02

    def __post_init__(self) -> None:
        """Checked at construction, so `ModelConfig(...)` built in Python is refused like the command line's."""
        require(isinstance(self.vocab_size, int) and self.vocab_size >= 2, "model.vocab_size",
                f"must be an integer ≥ 2 (null: the tokenizer's size, filled in by lab-train), got {self.vocab_size}")
        require(self.n_layers >= 1, "model.n_layers", f"must be ≥ 1, got {self.n_layers}")
        require(self.n_heads >= 1, "model.n_heads", f"must be ≥ 1, got {self.n_heads}")
        require(self.d_model >= 1, "model.d_model", f"must be ≥ 1, got {self.d_model}")
        # torch refuses these only while building the model (a negative width, a negative or NaN std): a traceback
        require(isinstance(self.mlp_ratio, int) and self.mlp_ratio >= 1, "model.mlp_ratio", f"must be an integer ≥ 1, got {self.mlp_ratio}")
        for field, value in (("rope_base", self.rope_base), ("norm_eps", self.norm_eps)):
            require(math.isfinite(value) and value > 0, f"model.{field}", f"must be a finite number > 0, got {value}")
        require(math.isfinite(self.init_std) and self.init_std >= 0, "model.init_std", f"must be a finite number ≥ 0, got {self.init_std}")
        require(
            self.d_model % self.n_heads == 0 and (self.d_model // self.n_heads) % 2 == 0,
            "model.d_model",
            f"must be divisible by model.n_heads with an even head size, got {self.d_model}/{self.n_heads}",
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalize(x, self.weight)

    def normalize(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The norm with `weight` in place of its own (the objective passes detached leaves); a HF final norm has the same method."""
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)


@dataclass
class AttentionContext:
    """What every attention layer of one row set needs: the mask and the rotary angles.

    Built once per (segment_ids, position_ids) and shared by the trunk and the head
    blocks that run on the same rows.
    """

    mask: torch.Tensor | None  # [B, 1, S, S_keys] bool, True = may attend (None: every key)
    cos: torch.Tensor  # [B, 1, S, hd/2]
    sin: torch.Tensor  # [B, 1, S, hd/2]
    # Incremental decoding: the key/value caches (lab.decode_core.cache.CacheSet). Each attention
    # layer appends its new rows to its own cache and attends over cached + new keys.
    kv: object | None = None
    # [B, S] the rows' positions (restarting per document): a transformers decoder layer (the HF trunk,
    # native head blocks) computes its own rotary angles from them. None in decoding: positions follow the cache.
    position_ids: torch.Tensor | None = None

    @staticmethod
    def build(segment_ids, position_ids, key_valid, head_dim: int, rope_base: float):
        mask = document_causal_mask(segment_ids, key_valid)
        return AttentionContext(mask, *rotary_angles(position_ids, head_dim, rope_base), position_ids=position_ids)


def document_causal_mask(segment_ids: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """[B, S] segments, [B, S] key validity -> [B, 1, S, S]: attend to earlier valid keys of the same occurrence.

    The diagonal is always allowed so that a padding or hole row still has one key
    (otherwise SDPA returns NaN rows that would poison gradients through masked sums).
    """
    S = segment_ids.shape[1]
    same_doc = segment_ids[:, :, None] == segment_ids[:, None, :]  # [B, S(query), S(key)]
    causal = torch.ones(S, S, dtype=torch.bool, device=segment_ids.device).tril()  # [S, S]
    keys_ok = key_valid[:, None, :]  # [B, 1, S(key)]
    diagonal = torch.eye(S, dtype=torch.bool, device=segment_ids.device)  # [S, S]
    return ((same_doc & causal & keys_ok) | diagonal)[:, None]  # [B, 1, S, S]


def rotary_angles(position_ids: torch.Tensor, head_dim: int, base: float):
    """[B, S] positions -> cos, sin of shape [B, 1, S, head_dim/2] (per-document positions)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim)
    angles = position_ids.float()[:, :, None] * inv_freq  # [B, S, hd/2]
    return angles.cos()[:, None], angles.sin()[:, None]  # [B, 1, S, hd/2]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]  # [B, H, S, hd/2] each
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # [B, H, S, hd/2, 2]
    return rotated.flatten(-2).type_as(x)  # [B, H, S, hd]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        B, S, d = x.shape
        q, k, v = self.qkv(x).view(B, S, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)  # 3 × [B, H, S, hd]
        q, k = apply_rotary(q, ctx.cos, ctx.sin), apply_rotary(k, ctx.cos, ctx.sin)
        if ctx.kv is not None:
            k, v = ctx.kv.extend(self, k, v)  # [B, H, S_cached + S, hd] each
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.mask)  # [B, H, S, hd]
        return self.proj(y.transpose(1, 2).reshape(B, S, d))  # [B, S, d]


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm transformer block; the unit that heads reuse."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), ctx)
        return x + self.mlp(self.mlp_norm(x))


def init_weights(module: nn.Module, std: float) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)

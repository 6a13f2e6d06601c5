"""The GPT trunk: token embedding, `n_layers` blocks (lab/nn/blocks.py), the final norm and unembedding the heads share.

The trunk returns hidden states *before* the final norm; the objective applies the final norm and
the unembedding so the backward schedule decides when the V-wide logits live.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from lab.errors import require
from lab.nn.blocks import AttentionContext, Block, ModelConfig, RMSNorm, init_weights


class Trunk(nn.Module):
    """Token embedding → `n_layers` blocks. Owns the final norm and the unembedding the heads share."""

    # What decoding asks of a trunk (lab/model/trunk_spec.py): the harness's own KV cache, no position limit,
    # no transformers model behind it, and every trunk it builds can be decoded.
    cache_protocol = "stack"
    context_length = None
    transformers_model = None

    def __init__(self, cfg: ModelConfig, n_layers: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers if n_layers is None else n_layers))
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.unembed = None if cfg.tie_embeddings else nn.Parameter(torch.empty(cfg.vocab_size, cfg.d_model))
        self.apply(lambda m: init_weights(m, cfg.init_std))
        if self.unembed is not None:
            nn.init.normal_(self.unembed, std=cfg.init_std)

    @property
    def unembedding(self) -> nn.Parameter:
        """[V, d]; the embedding matrix itself when tied (same Parameter object)."""
        return self.embed.weight if self.unembed is None else self.unembed

    def attention_context(self, segment_ids, position_ids, key_valid) -> AttentionContext:
        head_dim = self.cfg.d_model // self.cfg.n_heads
        return AttentionContext.build(segment_ids, position_ids, key_valid, head_dim, self.cfg.rope_base)

    def check_vocabulary(self, tokenizer_vocab: int) -> None:
        """Every token id the tokenizer makes has an embedding row (model.vocab_size was set, or taken from the tokenizer)."""
        require(tokenizer_vocab <= self.cfg.vocab_size, "model.vocab_size",
                f"must be ≥ the tokenizer's {tokenizer_vocab} ids (or null: the tokenizer's size), got {self.cfg.vocab_size}")

    def decoding_refusal(self) -> str | None:
        return None

    def forward(self, tokens: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        x = self.embed(tokens)  # [B, S, d]
        for block in self.blocks:
            x = block(x, ctx)
        return x  # [B, S, d], before the final norm

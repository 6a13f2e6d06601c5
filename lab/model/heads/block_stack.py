"""Heads made of transformer block stacks: the stack itself, the heads built from K of them (parallel, causal,
anticausal differ only in wiring), and the helpers their blocks share with DeepSeek's depth modules."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from lab.errors import require
from lab.nn.flops import block_forward_flops
from lab.model.heads.base import MTPHead, NextTokenPath
from lab.model.heads.config import HeadConfig
from lab.model.heads.independent_drafter import IndependentHeads
from lab.nn.native_layers import NativeLayers, layer_forward_flops
from lab.nn.blocks import AttentionContext, Block, ModelConfig


def native_layers(cfg: HeadConfig, model_cfg: ModelConfig) -> NativeLayers | None:
    """The HF trunk's layer builder when `head.block=native` (its cfg carries one), else None: harness blocks."""
    if cfg.block != "native":
        return None
    native = getattr(model_cfg, "native", None)
    require(native is not None, "head.block", "native builds the Hugging Face model's own decoder layer: it needs model=hf; allowed here: lab")
    return native


def head_block_flops(block: nn.Module, model_cfg: ModelConfig, rows: int) -> int:
    """Forward matmul FLOPs of one head block (a harness Block or a native decoder layer) on `rows` rows."""
    return block_forward_flops(model_cfg, rows) if isinstance(block, Block) else layer_forward_flops([block], rows, model_cfg.d_model)


class BlockStack(nn.Module):
    """`n` transformer blocks applied in sequence: one head of a block architecture. With `native`, the
    blocks are the HF model's decoder layers numbered from `first_index` among the head's layers."""

    def __init__(self, model_cfg: ModelConfig, n: int, native: NativeLayers | None = None, first_index: int = 0):
        super().__init__()
        self.native = native
        self.blocks = nn.ModuleList(Block(model_cfg) if native is None else native.build(first_index + i) for i in range(n))

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if self.native is not None:
            return self.native.run(self.blocks, x, ctx)  # [B, S, d]
        for block in self.blocks:
            x = block(x, ctx)
        return x


class BlockStackHead(MTPHead):
    """Heads made of K block stacks (parallel, causal, anticausal); they differ only in wiring."""

    horizon_containers = {**MTPHead.horizon_containers, "stacks": 1}
    drafter = IndependentHeads

    def __init__(self, cfg: HeadConfig, model_cfg: ModelConfig):
        super().__init__(cfg, model_cfg)
        native = native_layers(cfg, model_cfg)
        self.stacks = nn.ModuleList(BlockStack(model_cfg, cfg.n_layers, native, i * cfg.n_layers) for i in range(cfg.k))

    @staticmethod
    def main_path_blocks(cfg: HeadConfig) -> int:
        return cfg.n_layers

    @staticmethod
    def head_blocks(cfg: HeadConfig) -> int:
        return cfg.k * cfg.n_layers

    def forward_flops(self, seq_len: int, model_cfg: ModelConfig) -> int:
        return (self.head_blocks(self.cfg) + self.recomputed_blocks()) * head_block_flops(self.stacks[0].blocks[0], model_cfg, seq_len)

    def recomputed_blocks(self) -> int:
        """Blocks run a second time on a detached trunk state (`trunk_grad=detached`); 0 by default."""
        return 0

    def head_stacks(self) -> list[nn.Module]:
        return list(self.stacks)

    def next_token_stacks(self) -> list[int]:
        """Indices of the stacks horizon 1 runs after the trunk, in order (stack 0: horizon 1's own)."""
        return [0]

    def next_token_path(self) -> NextTokenPath:
        blocks = tuple(f"stacks.{i}.blocks.{b}" for i in self.next_token_stacks() for b in range(len(self.stacks[i].blocks)))
        return dataclasses.replace(super().next_token_path(), blocks=blocks)

"""Several block stacks of one shape run as one batched forward (decoding of independent draft heads).

At batch 1 a cached transformer block costs its operator launches, not its FLOPs, so K−1
draft heads run one after the other cost K−1 times the launches of one. Stacking their
weights on a leading group axis G runs them as one block-sized sequence of batched
matmuls; the group axis doubles as the batch axis of the one KV cache they share (each
group's rows are its own head's keys and values). Inference only: the weights are
detached copies taken when the object is built, so rebuild it after the weights change.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from lab.nn.blocks import AttentionContext, apply_rotary


class StackedBlock:
    """G `Block`s (same config) as one: x [G, n, d] -> [G, n, d], group g through block g."""

    def __init__(self, blocks: list[nn.Module]):
        def stacked(get) -> torch.Tensor:
            return torch.stack([get(block).detach() for block in blocks])

        self.n_heads, self.eps = blocks[0].attn.n_heads, blocks[0].attn_norm.eps
        self.attn_norm = stacked(lambda b: b.attn_norm.weight)[:, None]  # [G, 1, d]
        self.mlp_norm = stacked(lambda b: b.mlp_norm.weight)[:, None]  # [G, 1, d]
        # nn.Linear computes x @ W^T: keep W^T so every product is one bmm.
        self.qkv = stacked(lambda b: b.attn.qkv.weight).transpose(1, 2)  # [G, d, 3d]
        self.proj = stacked(lambda b: b.attn.proj.weight).transpose(1, 2)  # [G, d, d]
        self.up = stacked(lambda b: b.mlp.up.weight).transpose(1, 2)  # [G, d, r·d]
        self.down = stacked(lambda b: b.mlp.down.weight).transpose(1, 2)  # [G, r·d, d]

    def __call__(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        G, n, d = x.shape
        h = F.rms_norm(x, (d,), eps=self.eps) * self.attn_norm  # [G, n, d]
        q, k, v = torch.bmm(h, self.qkv).view(G, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)  # 3 × [G, H, n, hd]
        q, k = apply_rotary(q, ctx.cos, ctx.sin), apply_rotary(k, ctx.cos, ctx.sin)
        if ctx.kv is not None:
            k, v = ctx.kv.extend(self, k, v)  # [G, H, cached + n, hd]: group g's own rows
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=ctx.mask)  # [G, H, n, hd]
        x = x + torch.bmm(y.transpose(1, 2).reshape(G, n, d), self.proj)  # [G, n, d]
        h = F.rms_norm(x, (d,), eps=self.eps) * self.mlp_norm  # [G, n, d]
        return x + torch.bmm(F.gelu(torch.bmm(h, self.up)), self.down)  # [G, n, d]


class StackedBlocks:
    """G stacks of L blocks each: layer l runs the G blocks at depth l as one `StackedBlock`."""

    def __init__(self, stacks: list[nn.ModuleList]):
        self.layers = [StackedBlock(list(blocks)) for blocks in zip(*stacks, strict=True)]

    def __call__(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, ctx)
        return x  # [G, n, d]

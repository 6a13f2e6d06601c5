"""Medusa-1 heads (Cai et al. 2024): horizon k ≥ 2 is a stack of residual blocks x + SiLU(W x + b)
on the trunk state, then the shared final norm and a vocabulary projection — the shared lm_head
(`unembedding=shared`) or its own copy (`replicated`, Medusa's own). W and b start at zero, so a
fresh head predicts exactly what the next-token head predicts. Horizon 1 is the trunk itself.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from lab.model.heads.base import MTPHead, NextTokenPath
from lab.model.heads.independent_drafter import IndependentHeads


class ResidualSiLU(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(d, d)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))  # [B, S, d]


class MedusaHead(MTPHead):
    # blocks.i and projections.i serve horizon i + 2 (horizon 1 has neither)
    horizon_containers = {"blocks": 2, "projections": 2}
    drafter = IndependentHeads
    unused_options = ("init", "block")  # residual SiLU blocks, no transformer blocks to build or copy

    def __init__(self, cfg, model_cfg):
        super().__init__(cfg, model_cfg)
        d = model_cfg.d_model
        self.blocks = nn.ModuleList(nn.Sequential(*(ResidualSiLU(d) for _ in range(cfg.n_layers))) for _ in range(cfg.k - 1))
        if self.projections is not None:  # horizon 1 keeps the trunk's lm_head; horizons 2..K get their own
            self.projections = nn.ParameterList(list(self.projections)[1:])

    def projection(self, k, shared):
        return shared.unembedding if self.projections is None or k == 1 else self.projections[k - 2]  # [V, d]

    def forward_flops(self, seq_len, model_cfg):
        return (self.k - 1) * self.cfg.n_layers * 2 * seq_len * model_cfg.d_model ** 2  # one d×d map per block and row

    def next_token_path(self) -> NextTokenPath:
        return NextTokenPath()  # horizon 1 is the trunk's own projection

    def horizon_rows(self, trunk_hidden, ctx_for, extra=None):
        yield trunk_hidden  # [B, S, d]: horizon 1
        for blocks in self.blocks:
            yield blocks(trunk_hidden if extra is None else extra)  # [B, S, d]: horizon 2, 3, …

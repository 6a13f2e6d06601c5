"""Parallel heads (Gloeckle et al.): K independent block stacks on the trunk state."""

import torch.nn as nn

from lab.model.heads.base import BlockStack, MTPHead, endpoint_horizon


class ParallelHead(MTPHead):
    def __init__(self, cfg, model_cfg):
        super().__init__(cfg, model_cfg)
        self.stacks = nn.ModuleList(BlockStack(model_cfg, cfg.n_layers) for _ in range(cfg.k))

    @staticmethod
    def main_path_blocks(cfg):
        return cfg.n_layers

    def head_stacks(self):
        return list(self.stacks)

    def forward(self, trunk_hidden, batch, ctx, shared):
        horizons = []
        for k, stack in enumerate(self.stacks, start=1):
            source = trunk_hidden if k == 1 else self.extra_horizon_input(trunk_hidden)  # [B, S, d]
            horizons.append(endpoint_horizon(k, stack(source, ctx), batch, shared.final_norm, self.projection(k, shared)))
        return horizons

"""Linear heads: horizon k is its own linear map of the trunk state.

`unembedding=shared`: a d×d map per horizon, then the shared final norm + unembedding
(the linear variant of Gloeckle et al.). `unembedding=replicated`: no d×d map; each
horizon projects the trunk state with its own V×d matrix.
"""

import torch
import torch.nn as nn

import dataclasses

from lab.model.heads.base import MTPHead, NextTokenPath
from lab.model.heads.independent_drafter import IndependentHeads


class LinearHead(MTPHead):
    horizon_containers = {**MTPHead.horizon_containers, "maps": 1}
    drafter = IndependentHeads
    unused_options = ("n_layers", "init", "block")  # d×d maps, no head blocks
    drafts_read_trunk_rows = True

    def __init__(self, cfg, model_cfg):
        super().__init__(cfg, model_cfg)
        d = model_cfg.d_model
        self.maps = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(cfg.k)) if cfg.unembedding == "shared" else None

    def forward_flops(self, seq_len, model_cfg):
        d = model_cfg.d_model
        return 0 if self.maps is None else self.k * 2 * seq_len * d * d  # K d×d maps on every row

    def next_token_path(self) -> NextTokenPath:
        path = super().next_token_path()
        if self.maps is None:
            return path
        # A d×d map before the shared norm is no block: the release keeps it as a K = 1 linear head.
        return dataclasses.replace(path, release_head={"name": "linear", "k": 1, "compute_match": "none"}, kept=("maps.0.weight",))

    def horizon_rows(self, trunk_hidden, ctx_for, extra=None):
        for k in range(1, self.k + 1):
            source = trunk_hidden if k == 1 or extra is None else extra  # [B, S, d]
            yield source if self.maps is None else self.maps[k - 1](source)  # [B, S, d]

    def decode_drafter(self):
        """Maps 2..K as one batched product; replicated projections read the trunk rows themselves (G = 1)."""
        if self.maps is None:
            return lambda trunk_hidden, rest, ctx_for: trunk_hidden  # [1, n, d]
        maps_t = torch.stack([m.weight.detach() for m in self.maps[1:]]).transpose(1, 2)  # [K-1, d, d]: W^T per horizon
        return lambda trunk_hidden, rest, ctx_for: torch.matmul(trunk_hidden, maps_t)  # [K-1, n, d]

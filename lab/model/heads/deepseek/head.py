"""DeepSeek-V3 MTP: D sequential modules with teacher forcing.

Depth d (1..D) at source row t combines the previous depth's state for row t with the
embedding of the ground-truth token t+d, and predicts token t+d+1 (horizon d+1):

    h^d[t] = Block(W_proj [RMSNorm(h^{d-1}[t]) ; RMSNorm(Embed(tokens[t+d]))])

Each depth has one row fewer than the previous one. Rows whose window t..t+d leaves the
document (or hits a hole) have no state and are masked out as attention keys; rows with
state but no label stay as context and are not supervised. The embedding and the output
projection are the trunk's own Parameters (passed in as SharedParts, never copied).
"""

from dataclasses import dataclass

import torch
import torch.nn as nn

from lab.errors import ConfigError, require
from lab.labels import chain_masks
from lab.model.heads.base import HeadConfig, Horizon, MTPHead, head_block_flops, native_layers
from lab.model.heads.deepseek.drafter import DeepSeekChain
from lab.model.native_layers import NativeLayers
from lab.model.trunk import AttentionContext, Block, RMSNorm

HIDDEN_INPUTS = ("pre_norm", "post_norm")
FUSION_ORDERS = ("he", "eh")
# What depth d + 1 reads from depth d: its block output (the paper's h^d), or that output after the shared
# final norm (transformers' and vLLM's MTP loops pass on shared_head.norm's output).
CHAIN_STATES = ("block_output", "normed")


@dataclass
class DeepSeekConfig(HeadConfig):
    """DeepSeek is configured by its depth D; K = D + 1 follows (giving both must agree)."""

    name: str = "deepseek"
    k: int | None = None
    depth: int | None = None
    share_depth_weights: bool = False  # one module reused at every depth
    hidden_input: str = "pre_norm"  # the trunk state a depth-1 module consumes: before or after the final norm
    fusion_order: str = "he"  # [hidden ; embedding] or [embedding ; hidden] before the 2d→d projection
    chain_state: str = "block_output"  # what depth d + 1 reads from depth d (CHAIN_STATES)

    def __post_init__(self) -> None:
        """K follows from the depth (or the depth from K) before the fields are checked."""
        if self.k is None and self.depth is not None:
            self.k = self.depth + 1
        elif self.depth is None and self.k is not None:
            self.depth = self.k - 1
        super().__post_init__()


class DepthModule(nn.Module):
    """One depth: fusion and a transformer block (the harness's, or with `native` the HF model's own
    decoder layer, head layer number `index`, i.e. layer_idx N + d − 1 as in DeepSeek-V3's layout)."""

    def __init__(self, model_cfg, fusion_order: str, native: NativeLayers | None = None, index: int = 0):
        super().__init__()
        d = model_cfg.d_model
        self.fusion_order = fusion_order
        self.hidden_norm = RMSNorm(d, model_cfg.norm_eps)
        self.embed_norm = RMSNorm(d, model_cfg.norm_eps)
        self.proj = nn.Linear(2 * d, d, bias=False)
        self.native = native
        self.block = Block(model_cfg) if native is None else native.build(index, mtp=True)  # the family's MTP layer kind

    def forward(self, previous: torch.Tensor, teacher: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        parts = (self.hidden_norm(previous), self.embed_norm(teacher))  # 2 × [B, S-d, d]
        fused = self.proj(torch.cat(parts if self.fusion_order == "he" else parts[::-1], dim=-1))  # [B, S-d, 2d] -> [B, S-d, d]
        if self.native is not None:
            return self.native.run([self.block], fused, ctx)  # [B, S-d, d]
        return self.block(fused, ctx)  # [B, S-d, d]


class DeepSeekHead(MTPHead):
    drafter = DeepSeekChain
    config_class = DeepSeekConfig
    unused_options = ("n_layers",)  # one transformer block per depth module
    sharding_units = (DepthModule,)  # a depth module is one unit, its block nested inside it
    horizon_containers = {**MTPHead.horizon_containers, "depth_modules": 2}  # depth d predicts horizon d + 1

    @classmethod
    def check_config(cls, cfg):
        require(cfg.depth is not None, "head.depth", "must be set (an integer ≥ 1); K = depth + 1 follows")
        require(cfg.depth >= 1, "head.depth", f"must be ≥ 1, got {cfg.depth}")
        require(cfg.k == cfg.depth + 1, "head.k", f"deepseek needs head.k = head.depth + 1 = {cfg.depth + 1}, got {cfg.k}")
        super().check_config(cfg)
        require(cfg.unembedding == "shared", "head.unembedding", "deepseek shares the trunk's output head; allowed: shared")
        # Depth d consumes token t+d and predicts t+d+1: the chain is contiguous by construction.
        require(cfg.contiguous_offsets, "head.offsets",
                f"deepseek's chain predicts consecutive tokens; allowed: null or {list(range(1, cfg.k + 1))}, got {cfg.offsets}")
        for name, value, allowed in (("head.hidden_input", cfg.hidden_input, HIDDEN_INPUTS), ("head.fusion_order", cfg.fusion_order, FUSION_ORDERS),
                                     ("head.chain_state", cfg.chain_state, CHAIN_STATES)):
            if value not in allowed:
                raise ConfigError(name, f"unknown '{value}'; allowed: {', '.join(allowed)}")

    def __init__(self, cfg, model_cfg):
        super().__init__(cfg, model_cfg)
        depth = cfg.depth
        self.depth = depth
        self.head_dim = model_cfg.d_model // model_cfg.n_heads
        self.rope_base = model_cfg.rope_base
        n_modules = 1 if cfg.share_depth_weights else depth
        native = native_layers(cfg, model_cfg)
        self.depth_modules = nn.ModuleList(DepthModule(model_cfg, cfg.fusion_order, native, d) for d in range(n_modules))

    def horizon_of(self, name):
        if name.startswith("depth_modules.") and self.cfg.share_depth_weights:
            return "all"  # one module serves every depth
        return super().horizon_of(name)

    @staticmethod
    def head_blocks(cfg) -> int:
        # One block per depth, whether or not the depths share weights (D applications per token).
        return cfg.depth if cfg.depth is not None else cfg.k - 1

    def forward_flops(self, seq_len, model_cfg):
        d = model_cfg.d_model
        rows = [seq_len - depth for depth in range(1, self.depth + 1)]  # depth d runs on S-d rows
        block = self.depth_modules[0].block
        return sum(2 * r * (2 * d) * d + head_block_flops(block, model_cfg, r) for r in rows)  # 2d→d projection + block

    def module_at(self, d: int) -> DepthModule:
        return self.depth_modules[0 if self.cfg.share_depth_weights else d - 1]

    # ---- decoding: the draft chain (lab.model.heads.deepseek.drafter.ChainHead) ---------
    def chain_input(self, trunk_hidden, shared):
        """The target state that seeds depth 1 (as in training, before any detaching)."""
        return shared.final_norm(trunk_hidden) if self.cfg.hidden_input == "post_norm" else trunk_hidden  # [B, S, d]

    def next_depth_input(self, state, shared):
        """[..., d] depth d's output rows -> what depth d + 1 reads (head.chain_state)."""
        return shared.final_norm(state) if self.cfg.chain_state == "normed" else state

    def chain_module(self, step: int) -> DepthModule:
        """Module of draft step `step` (1-based): depth `step` for step ≤ D, then reused as step mod D."""
        return self.module_at((step - 1) % self.depth + 1)

    def initialize(self, trunk):
        super().initialize(trunk)
        if self.cfg.init == "copy_last":
            for module in self.depth_modules:
                module.block.load_state_dict(trunk.blocks[-1].state_dict())

    def _depth_context(self, batch, state_mask, d):
        seq_len = batch["tokens"].shape[1]
        base = slice(0, seq_len - d)  # base rows t of depth d
        return AttentionContext.build(
            batch["segment_ids"][:, base], batch["position_ids"][:, base], state_mask, self.head_dim, self.rope_base
        )

    def validity_mask(self, k, batch):
        return chain_masks(batch["active"], batch["segment_ids"], k - 1, batch.get("target_mask"))[1]  # [B, S-k]: depth k-1's loss rows

    def forward(self, trunk_hidden, batch, ctx, shared, n_horizons=None):
        tokens = batch["tokens"]  # [B, S]: labels
        inputs = batch.get("input_tokens", tokens)  # [B, S]: what the chain embeds (teacherless: answers are a dummy)
        seq_len = tokens.shape[1]
        horizons = [self.endpoint(1, trunk_hidden, batch, shared)]
        state = shared.final_norm(trunk_hidden) if self.cfg.hidden_input == "post_norm" else trunk_hidden  # [B, S, d]
        state = self.extra_horizon_input(state)
        for d in range(1, self.horizons_to_run(n_horizons)):  # depth d serves horizon d + 1
            state_mask, loss_mask = chain_masks(batch["active"], batch["segment_ids"], d, batch.get("target_mask"))  # [B, S-d], [B, S-d-1]
            teacher = shared.embed(inputs[:, d:])  # [B, S-d, d]: inputs[t+d]
            output = self.module_at(d)(state[:, : seq_len - d], teacher, self._depth_context(batch, state_mask, d))  # [B, S-d, d]
            state = self.next_depth_input(output, shared)  # [B, S-d, d]
            horizons.append(
                Horizon(
                    k=d + 1,
                    hidden=output[:, : seq_len - d - 1],  # [B, S-d-1, d]: rows that could have a label
                    labels=tokens[:, d + 1 :],  # [B, S-d-1]: tokens[t+d+1]
                    mask=loss_mask,  # [B, S-d-1]
                    norm=shared.final_norm,
                    weight=shared.unembedding,
                )
            )
        return horizons

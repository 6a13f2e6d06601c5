"""DeepSeek-V3 MTP: D sequential modules with teacher forcing, or a self-fed rollout of them.

Depth d (1..D) at source row t combines the previous depth's state for row t with the
embedding of the ground-truth token t+d, and predicts token t+d+1 (horizon d+1):

    h^d[t] = Block(W_proj [RMSNorm(h^{d-1}[t]) ; RMSNorm(Embed(tokens[t+d]))])

`head.rollout=self` trains the chain as decoding runs it (the seed's §0x06 and §0x09D): s =
`head.rollout_steps` ≥ D steps, step j running module (j − 1) mod D + 1 on step j − 1's state (one
module reused for every step when D = 1), so K = s + 1. Step j ≥ 2 reads the embedding of the token
step j − 1 drafted at the same row (`head.rollout_tokens=drafted`: its greedy top-1, within the
draft vocabulary when one is set; no gradient through the choice) or the data token
(`rollout_tokens=data`, as DeepSeek). Step 1 reads the data token t+1, as decoding reads the
frontier, so s = 1 is teacher-forced training exactly.

Each depth has one row fewer than the previous one. Rows whose window t..t+d leaves the
document (or hits a hole) have no state and are masked out as attention keys; rows with
state but no label stay as context and are not supervised. The embedding and the output
projection are the trunk's own Parameters (passed in as SharedParts, never copied).
"""

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from lab.errors import ConfigError, is_int, require
from lab.labels import chain_masks
from lab.horizon import Horizon
from lab.model.heads.base import MTPHead, UnusedWhen
from lab.model.heads.block_stack import head_block_flops, native_layers
from lab.model.heads.config import HeadConfig
from lab.model.heads.deepseek.drafter import DeepSeekChain
from lab.nn.native_layers import NativeLayers
from lab.nn.blocks import AttentionContext, Block, RMSNorm

HIDDEN_INPUTS = ("pre_norm", "post_norm")
FUSION_ORDERS = ("he", "eh")
# What depth d + 1 reads from depth d: its block output (the paper's h^d), or that output after the shared
# final norm (transformers' and vLLM's MTP loops pass on shared_head.norm's output).
CHAIN_STATES = ("block_output", "normed")
ROLLOUTS = ("teacher", "self")  # gold tokens through D modules, or s self-fed steps of them
ROLLOUT_TOKENS = ("drafted", "data")  # what a self-fed step ≥ 2 embeds: the previous step's top-1, or the data token


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
    rollout: str = "teacher"  # ROLLOUTS
    rollout_steps: int | None = None  # rollout=self: chain steps s ≥ depth (default: depth); K = s + 1
    rollout_tokens: str = "drafted"  # rollout=self: what step ≥ 2 embeds (ROLLOUT_TOKENS)

    def __post_init__(self) -> None:
        """K follows from the chain's steps (or the depth from K) before the fields are checked."""
        if self.rollout == "self" and self.rollout_steps is None:
            self.rollout_steps = self.depth if self.depth is not None else (None if self.k is None else self.k - 1)
        steps = self.rollout_steps if self.rollout == "self" else self.depth
        if self.k is None and steps is not None:
            self.k = steps + 1
        elif self.depth is None and self.k is not None:
            self.depth = self.k - 1
        super().__post_init__()

    @property
    def chain_steps(self) -> int:
        """Steps the chain runs in training, and the drafts decoding makes per round by default."""
        return self.rollout_steps if self.rollout == "self" else self.depth


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
    unused_when = (UnusedWhen("rollout_tokens", (("rollout", "teacher"),), "head.rollout=teacher embeds the data token at every depth"),
                   UnusedWhen("rollout_tokens", (("rollout", "self"), ("rollout_steps", 1)),
                              "a self-fed rollout of head.rollout_steps=1 has no step ≥ 2 to embed a token for"))
    sharding_units = (DepthModule,)  # a depth module is one unit, its block nested inside it
    horizon_containers = {**MTPHead.horizon_containers, "depth_modules": 2}  # depth d predicts horizon d + 1

    @classmethod
    def check_config(cls, cfg):
        require(cfg.depth is not None, "head.depth", "must be set (an integer ≥ 1); K = depth + 1 follows")
        require(cfg.depth >= 1, "head.depth", f"must be ≥ 1, got {cfg.depth}")
        cls.check_rollout(cfg)
        if cfg.rollout == "self":
            require(cfg.k == cfg.rollout_steps + 1, "head.k",
                    f"a self-fed rollout of {cfg.rollout_steps} steps predicts K = head.rollout_steps + 1 = {cfg.rollout_steps + 1}, got {cfg.k}")
        else:
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

    @staticmethod
    def check_rollout(cfg) -> None:
        for name, value, allowed in (("head.rollout", cfg.rollout, ROLLOUTS), ("head.rollout_tokens", cfg.rollout_tokens, ROLLOUT_TOKENS)):
            if value not in allowed:
                raise ConfigError(name, f"unknown '{value}'; allowed: {', '.join(allowed)}")
        if cfg.rollout == "teacher":
            require(cfg.rollout_steps is None, "head.rollout_steps",
                    "sets the steps of a self-fed rollout: it needs head.rollout=self (teacher forcing runs head.depth steps)")
            return
        steps = cfg.rollout_steps
        require(is_int(steps) and steps >= cfg.depth, "head.rollout_steps",
                f"must be an integer ≥ head.depth={cfg.depth} (each depth module runs at least once), got {steps!r}")
        require(not cfg.share_depth_weights, "head.share_depth_weights",
                "a self-fed rollout already reuses its modules (step j runs module (j − 1) mod D + 1); set head.depth=1 for one module")

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
        if name.startswith("depth_modules.") and (self.cfg.share_depth_weights or self.cfg.chain_steps > self.depth):
            return "all"  # one module serves several steps
        return super().horizon_of(name)

    @staticmethod
    def head_blocks(cfg) -> int:
        # One block per chain step, whether or not the steps share weights (D, or s self-fed, applications per token).
        if cfg.rollout == "self" and cfg.rollout_steps is not None:
            return cfg.rollout_steps
        return cfg.depth if cfg.depth is not None else cfg.k - 1

    @property
    def chain_steps(self) -> int:
        return self.cfg.chain_steps

    def forward_flops(self, seq_len, model_cfg):
        d = model_cfg.d_model
        rows = [seq_len - step for step in range(1, self.chain_steps + 1)]  # step j runs on S-j rows
        block = self.depth_modules[0].block
        return sum(2 * r * (2 * d) * d + head_block_flops(block, model_cfg, r) for r in rows)  # 2d→d projection + block

    @torch.no_grad()
    def greedy_tokens(self, output: torch.Tensor, shared) -> torch.Tensor:
        """[B, n, d] a step's rows -> [B, n] their top-1 ids (within the draft vocabulary when one is set)."""
        weight = shared.unembedding if shared.draft_ids is None else shared.unembedding[shared.draft_ids]  # [V or N, d]
        choice = F.linear(shared.final_norm(output), weight).argmax(-1)  # [B, n]
        return choice if shared.draft_ids is None else shared.draft_ids[choice]

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
        drafted = None  # [B, S-d+1] step d−1's top-1 at each row (self-fed rollout with drafted tokens)
        for d in range(1, self.horizons_to_run(n_horizons)):  # step d serves horizon d + 1
            state_mask, loss_mask = chain_masks(batch["active"], batch["segment_ids"], d, batch.get("target_mask"))  # [B, S-d], [B, S-d-1]
            read = inputs[:, d:] if drafted is None else drafted[:, : seq_len - d]  # [B, S-d]: token t+d, data or drafted at row t
            output = self.chain_module(d)(state[:, : seq_len - d], shared.embed(read), self._depth_context(batch, state_mask, d))  # [B, S-d, d]
            state = self.next_depth_input(output, shared)  # [B, S-d, d]
            if self.cfg.rollout == "self" and self.cfg.rollout_tokens == "drafted":
                drafted = self.greedy_tokens(output, shared)  # [B, S-d]: step d's draft of token t+d+1 at row t
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

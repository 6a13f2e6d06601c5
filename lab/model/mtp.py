"""Trunk + head: the whole network, returning one `Horizon` per predicted offset."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import dataclasses
from collections.abc import Mapping

from lab.errors import ConfigError, require
from lab.model.heads import HeadConfig, Horizon, SharedParts, head_class, head_config
from lab.model.trunk import ModelConfig, Trunk


# Head blocks that take the place of trunk blocks, by `head.compute_match` (DESIGN.md §4).
COMPUTE_MATCH_REMOVES = {
    # the paper's: trunk blocks + every head block (DeepSeek depth blocks too) = model.n_layers
    "blocks": lambda head, cfg: head.head_blocks(cfg),
    # only the horizon-1 path (trunk + its head blocks) keeps model.n_layers
    "next_token_path": lambda head, cfg: head.main_path_blocks(cfg),
    # the heads are added on top of an unchanged trunk
    "none": lambda head, cfg: 0,
}


def trunk_layers(model_cfg: ModelConfig, head_cfg: HeadConfig) -> int:
    """Trunk blocks under `head.compute_match`; refuses a model left without a trunk block."""
    removed = COMPUTE_MATCH_REMOVES[head_cfg.compute_match](head_class(head_cfg.name), head_cfg)
    n = model_cfg.n_layers - removed
    require(
        n >= 1,
        "head.compute_match",
        f"{head_cfg.compute_match} leaves {n} trunk blocks (model.n_layers={model_cfg.n_layers} minus {removed} head blocks "
        f"of head={head_cfg.name} head.k={head_cfg.k} "
        + (f"head.depth={depth}" if (depth := getattr(head_cfg, "depth", None)) is not None else f"head.n_layers={head_cfg.n_layers}")
        + "); need ≥ 1: raise model.n_layers "
        "or set head.compute_match to " + " or ".join(m for m in COMPUTE_MATCH_REMOVES if m != head_cfg.compute_match),
    )
    return n


def model_config(values: Mapping | ModelConfig) -> ModelConfig:
    """The typed, checked trunk config; fields left out take the `model` group's defaults."""
    if isinstance(values, ModelConfig):
        values = dataclasses.asdict(values)
    known = [f.name for f in dataclasses.fields(ModelConfig)]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"model.{unknown[0]}", f"unknown option; allowed: {', '.join(known)}")
    cfg = ModelConfig(**values)
    cfg.validate()
    return cfg


def build_model(model: Mapping, head: Mapping) -> "MTPModel":
    """The network from the same mappings as the `model` and `head` config groups, checked like the CLI.

    `build_model({"vocab_size": 13, "d_model": 32}, {"name": "deepseek", "depth": 2})`
    """
    return MTPModel(model_config(model), head_config(head))


class MTPModel(nn.Module):
    """Trunk + head from typed configs (`model_config`, `head_config` or `build_model` check them)."""

    def __init__(self, model_cfg: ModelConfig, head_cfg: HeadConfig):
        super().__init__()
        self.model_cfg, self.head_cfg = model_cfg, head_cfg
        self.trunk = Trunk(model_cfg, trunk_layers(model_cfg, head_cfg))
        self.head = head_class(head_cfg.name)(head_cfg, model_cfg)
        self.head.initialize(self.trunk)
        if head_cfg.trunk_grad == "frozen":
            freeze_trunk(self)
        check_alias_contract(self)

    @property
    def k(self) -> int:
        return self.head.k

    def shared_parts(self) -> SharedParts:
        return SharedParts(self.trunk.embed, self.trunk.final_norm, self.trunk.unembedding)

    def forward(self, batch: dict, n_horizons: int | None = None) -> list[Horizon]:
        """Horizons 1..K, or only the first `n_horizons` (the others' blocks and projections never run)."""
        ctx = self.trunk.attention_context(batch["segment_ids"], batch["position_ids"], batch["active"])
        hidden = self.trunk(input_tokens(batch), ctx)  # [B, S, d]
        if n_horizons is None or n_horizons >= self.k:
            return self.head(hidden, batch, ctx, self.shared_parts())  # a head written without skipping support works too
        return self.head(hidden, batch, ctx, self.shared_parts(), n_horizons)

    def horizon_logits(self, k: int, rows: torch.Tensor) -> torch.Tensor:
        """[..., d] rows of horizon k (before the final norm) -> [..., V] logits."""
        return F.linear(self.trunk.final_norm(rows), self.head.projection(k, self.shared_parts()))

    @torch.no_grad()
    def next_token_logits(self, batch: dict) -> torch.Tensor:
        """[B, S, V]: row t holds the horizon-1 logits for token t+1, every t including the last."""
        ctx = self.trunk.attention_context(batch["segment_ids"], batch["position_ids"], batch["active"])
        hidden = self.trunk(input_tokens(batch), ctx)  # [B, S, d]
        rows = next(self.head.horizon_rows(hidden, lambda key: ctx))  # [B, S, d]: horizon 1 at every row
        return self.horizon_logits(1, rows)  # [B, S, V]


def input_tokens(batch: dict) -> torch.Tensor:
    """[B, S] the ids the model embeds: `input_tokens` when the batch has that view (the teacherless
    objective, lab/data/synthetic/teacherless.py), else `tokens`. Labels always come from `tokens`."""
    return batch.get("input_tokens", batch["tokens"])


def freeze_trunk(model: MTPModel) -> None:
    """`head.trunk_grad=frozen`: trunk blocks, embedding, final norm and unembedding take no gradient
    (so the optimizer holds no state for them); only the head's own Parameters train."""
    model.trunk.requires_grad_(False)
    require(any(p.requires_grad for p in model.parameters()), "head.trunk_grad",
            f"frozen leaves head={model.head_cfg.name} nothing to train (it has no parameters of its own); allowed: joint, detached")


def alias_groups(model: nn.Module) -> list[list[str]]:
    """Names that refer to the same Parameter object (e.g. tied embedding/unembedding)."""
    by_id: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(param), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def check_alias_contract(model: MTPModel) -> None:
    """Shared parts are the trunk's own Parameters, and each Parameter is listed once."""
    shared = model.shared_parts()
    assert shared.embed is model.trunk.embed and shared.unembedding is model.trunk.unembedding
    if model.model_cfg.tie_embeddings:
        assert model.trunk.unembedding is model.trunk.embed.weight, "tied unembedding must be the embedding Parameter"
    unique = list(model.parameters())
    assert len({id(p) for p in unique}) == len(unique), "a Parameter is listed twice"


def parameter_table(model: MTPModel) -> dict:
    """Transformer blocks by place, and parameter counts by owner: trunk, head-private, shared
    (embedding, final norm, unembedding). `blocks_head` counts block applications per token
    (DeepSeek depths that share weights still run D blocks)."""
    shared_ids = {id(p) for p in (model.trunk.embed.weight, model.trunk.final_norm.weight, model.trunk.unembedding)}
    count = lambda params: sum(p.numel() for p in params)  # noqa: E731
    trunk_blocks = [p for p in model.trunk.blocks.parameters()]
    head_private = [p for p in model.head.parameters() if id(p) not in shared_ids]
    shared = [p for p in model.parameters() if id(p) in shared_ids]
    head = head_class(model.head_cfg.name)
    blocks_trunk = len(model.trunk.blocks)
    blocks_head = head.head_blocks(model.head_cfg)
    return {
        "head": model.head_cfg.name,
        "k": model.k,
        "compute_match": model.head_cfg.compute_match,
        "blocks_trunk": blocks_trunk,
        "blocks_head": blocks_head,
        "blocks_total": blocks_trunk + blocks_head,
        "blocks_next_token_path": blocks_trunk + head.main_path_blocks(model.head_cfg),
        "params_trunk": count(trunk_blocks),
        "params_head_private": count(head_private),
        "params_shared": count(shared),
        "params_total": count(model.parameters()),
    }

"""Trunk + head: the whole network, returning one `Horizon` per predicted offset."""

from __future__ import annotations

import torch
import torch.nn as nn

import dataclasses
from collections.abc import Mapping
from typing import Any

from lab.errors import require
from lab.nn.draft_vocab import check_draft_vocab, draft_logits, index_of, restrict_horizon
from lab.horizon import Horizon, KnownRows
from lab.model.heads import HeadConfig, SharedParts, head_class, head_config
from lab.model.trunk_spec import DEFAULT_TRUNK
from lab.model.trunks import trunk_spec
from lab.schema import typed


def model_config(values: Mapping | Any) -> Any:
    """The typed, checked trunk config of the family `values` names (lab/model/trunk_spec.py); fields left out
    take the family's defaults (the harness's GPT: the `model` group has no `name`)."""
    spec = trunk_spec(values)
    if isinstance(values, spec.config):
        return values  # typed and checked when it was constructed
    owner = "the model group" if spec.name == DEFAULT_TRUNK else f"model={spec.name}"
    return typed(spec.config, values, "model", owner=owner)


def build_model(model: Mapping, head: Mapping) -> "MTPModel":
    """The network from the same mappings as the `model` and `head` config groups, checked like the CLI.

    `build_model({"vocab_size": 13, "d_model": 32}, {"name": "deepseek", "depth": 2})`
    """
    model_cfg = model_config(model)
    return MTPModel(model_cfg, head_config(head_defaults_for(model_cfg, head)))


def head_defaults_for(model_cfg, head: Mapping) -> dict:
    """Head fields left null (or out) that the trunk family sets: `compute_match` is `none` on a pretrained
    trunk, whose layers are never dropped (on the harness's GPT, `head_config` gives HeadConfig's default)."""
    head = dict(head)
    for name, value in trunk_spec(model_cfg).head_defaults.items():
        if head.get(name) is None:
            head[name] = value
    return head


def fill_vocab_size(model: dict, vocab_size: int) -> dict:
    """The tokenizer's vocabulary size into a `model` mapping whose family takes it from there (the GPT, when null)."""
    return trunk_spec(model).fill_vocab_size(model, vocab_size)


def check_vocabulary(model: "MTPModel", tokenizer_vocab: int) -> None:
    """Every token id the tokenizer makes has a row in the model's embedding."""
    model.trunk.check_vocabulary(tokenizer_vocab)


def check_head_on_trunk(model_cfg, head_cfg: HeadConfig) -> None:
    """Head options whose meaning depends on the trunk family (pre-flight and build both run this)."""
    trunk_spec(model_cfg).check_head(model_cfg, head_cfg)


def build_trunk(model_cfg, head_cfg: HeadConfig) -> nn.Module:
    check_head_on_trunk(model_cfg, head_cfg)
    return trunk_spec(model_cfg).build(model_cfg, head_cfg)


class MTPModel(nn.Module):
    """Trunk + head from typed configs (`model_config`, `head_config` or `build_model` check them)."""

    def __init__(self, model_cfg, head_cfg: HeadConfig):  # model_cfg: its trunk family's typed config
        super().__init__()
        head_class(head_cfg.name).check_config(head_cfg)  # a config built in Python skipped build_config
        self.model_cfg, self.head_cfg = model_cfg, head_cfg
        self.trunk = build_trunk(model_cfg, head_cfg)
        self.head = head_class(head_cfg.name)(head_cfg, self.trunk.cfg)  # head blocks take the trunk's width and heads
        # model.dtype (a bf16 HF trunk): head-private weights compute in the trunk's precision, before any copy into them
        self.head.to(dtype=self.trunk.unembedding.dtype)
        self.head.initialize(self.trunk)
        self.register_draft_vocab(head_cfg.draft_vocab)
        if head_cfg.trunk_grad == "frozen":
            freeze_trunk(self)
        if head_cfg.trunk_grad == "lora":
            from lab.nn.lora import add_lora_adapters

            add_lora_adapters(self.trunk, head_cfg.lora)
        check_alias_contract(self)
        trunk_spec(model_cfg).check_model(model_cfg, self)

    def register_draft_vocab(self, n: int | None) -> None:
        """`draft_ids` [N]: the draft vocabulary's ids, a buffer so checkpoints carry them (None: full vocabulary).
        Placeholder −1s until `set_draft_ids` fills them from the training counts (or a checkpoint loads them)."""
        vocab = self.trunk.unembedding.shape[0]
        check_draft_vocab(n, vocab, self.k)
        self.register_buffer("draft_ids", None if n is None else torch.full((n,), -1, dtype=torch.long))

    def set_draft_ids(self, ids: torch.Tensor | None) -> None:
        """Use `ids` [N] as the draft vocabulary of horizons ≥ 2 (None: the full vocabulary again)."""
        if ids is None:
            self.draft_ids = None
            return
        vocab = self.trunk.unembedding.shape[0]
        require(ids.ndim == 1 and ids.numel() == len(set(ids.tolist())) and 0 <= int(ids.min()) and int(ids.max()) < vocab,
                "head.draft_vocab", f"the draft ids must be distinct ids in [0, {vocab}), got {ids.numel()} of them")
        self.draft_ids = ids.to(device=self.trunk.unembedding.device, dtype=torch.long)

    def restrict_to_draft_vocab(self, horizons: list[Horizon]) -> list[Horizon]:
        """Horizons ≥ 2 over the draft vocabulary (horizon 1, the next-token path, keeps all V)."""
        if self.draft_ids is None:
            return horizons
        table = index_of(self.draft_ids, self.trunk.unembedding.shape[0])  # [V]
        return [h if h.k == 1 else restrict_horizon(h, self.draft_ids, table) for h in horizons]

    @property
    def hf_model(self) -> nn.Module:
        """The transformers model itself (same Parameters) when the trunk is one (`model=hf`)."""
        require(self.trunk.transformers_model is not None, "model", "hf_model exists for a transformers trunk (model=hf) only")
        return self.trunk.transformers_model

    @property
    def k(self) -> int:
        return self.head.k

    def shared_parts(self) -> SharedParts:
        return SharedParts(self.trunk.embed, self.trunk.final_norm, self.trunk.unembedding, getattr(self, "draft_ids", None))

    def forward(self, batch: dict, n_horizons: int | None = None) -> list[Horizon]:
        """Horizons 1..K, or only the first `n_horizons` (the others' blocks and projections never run)."""
        ctx = self.trunk.attention_context(batch["segment_ids"], batch["position_ids"], batch["active"])
        hidden = self.trunk_output(batch, ctx)  # [B, S, d]
        if n_horizons is None or n_horizons >= self.k:
            horizons = self.head(hidden, batch, ctx, self.shared_parts())  # a head written without skipping support works too
        else:
            horizons = self.head(hidden, batch, ctx, self.shared_parts(), n_horizons)
        return self.with_known_next_token(self.restrict_to_draft_vocab(horizons), batch, hidden)

    def with_known_next_token(self, horizons: list[Horizon], batch: dict, hidden: torch.Tensor) -> list[Horizon]:
        """Horizon 1 with its per-row loss and hits from the hidden-state cache (`next_token_loss` /
        `next_token_hit`, lab/training/hidden_cache.py) when it is exactly the frozen trunk's own next-token
        path: its rows are the cached trunk rows, projected by the trunk's final norm and unembedding, and
        nothing in it takes a gradient. Its loss is then the same at every step, and the step skips its
        V-wide logits. Any other horizon 1 (a head's own block or projection) is computed as always."""
        first = horizons[0]
        if "next_token_loss" not in batch or not self.is_trunk_next_token(first, hidden):
            return horizons
        known = KnownRows(batch["next_token_loss"], batch["next_token_hit"])  # [B, S-1] each
        return [dataclasses.replace(first, known=known), *horizons[1:]]

    def is_trunk_next_token(self, horizon: Horizon, hidden: torch.Tensor) -> bool:
        """`horizon` is the trunk's own, constant next-token prediction on rows `hidden` [B, S, d]."""
        trunk = self.trunk
        rows = horizon.hidden  # [B, S-1, d] when it is hidden[:, :-1] itself
        same_rows = (rows.data_ptr() == hidden.data_ptr() and rows.stride() == hidden.stride()
                     and tuple(rows.shape) == (hidden.shape[0], hidden.shape[1] - 1, *hidden.shape[2:]))
        constant = not (rows.requires_grad or horizon.weight.requires_grad or horizon.norm.weight.requires_grad)
        return (horizon.offset == 1 and horizon.teacher is None and horizon.vocab_ids is None and same_rows and constant
                and horizon.weight is trunk.unembedding and horizon.norm is trunk.final_norm)

    def trunk_output(self, batch: dict, ctx) -> torch.Tensor:
        """[B, S, d] the trunk's hidden state: run, or read from the batch when a hidden-state cache supplies
        it (`trunk_hidden`, lab/training/hidden_cache.py; a frozen trunk only, whose state no step changes)."""
        if "trunk_hidden" not in batch:
            return self.trunk(input_tokens(batch), ctx)  # [B, S, d]
        require(self.head_cfg.trunk_grad == "frozen", "hidden_cache",
                f"a batch with cached trunk states needs head.trunk_grad=frozen, got {self.head_cfg.trunk_grad}")
        return batch["trunk_hidden"]  # [B, S, d]

    def horizon_logits(self, k: int, rows: torch.Tensor) -> torch.Tensor:
        """[..., d] rows of horizon k (before the final norm) -> [..., V] logits; a horizon ≥ 2 under a draft
        vocabulary projects on its N rows only and is −inf at every other id."""
        ids = None if k == 1 else self.draft_ids
        return draft_logits(self.trunk.final_norm(rows), self.head.projection(k, self.shared_parts()), ids)

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
    model.trunk.frozen = True  # a HF trunk also runs without graph, in eval mode
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
    if getattr(model.model_cfg, "tie_embeddings", False):
        assert model.trunk.unembedding is model.trunk.embed.weight, "tied unembedding must be the embedding Parameter"
    unique = list(model.parameters())
    assert len({id(p) for p in unique}) == len(unique), "a Parameter is listed twice"


def final_norm_parameters(trunk: nn.Module) -> list[nn.Parameter]:
    """The final norm's Parameters (a HF LayerNorm has a bias too)."""
    norm = trunk.final_norm
    return list(getattr(norm, "module", norm).parameters())


def parameter_table(model: MTPModel) -> dict:
    """Transformer blocks by place, and parameter counts by owner: trunk, head-private, shared
    (embedding, final norm, unembedding). `blocks_head` counts block applications per token
    (DeepSeek depths that share weights still run D blocks)."""
    shared_ids = {id(p) for p in (model.trunk.embed.weight, model.trunk.unembedding)}
    shared_ids |= {id(p) for p in final_norm_parameters(model.trunk)}
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

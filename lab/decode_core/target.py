"""The target model over cached state: the next-token path, one forward per call.

A forward appends its rows provisionally to every cache it touches; the decoder then
commits the verified rows (or everything, in plain decoding). Rows of horizons ≥ 2
(independent draft heads) are left to the caller as a lazy iterator, so plain decoding
never runs the draft stacks and speculative decoding can time them as draft work. A
forward over a draft tree gives every node its depth's position and a mask that shows
it its ancestors only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from lab.errors import require
from lab.decode_core.cache import CacheSet
from lab.decode_core.hf_cache import use_transformers_cache

TRUNK = ("trunk",)
# How a trunk's cache protocol (its `cache_protocol`) sets up the trunk's cache in a CacheSet: the harness's
# StackCache is the CacheSet's default; a transformers trunk keeps its own DynamicCache.
TRUNK_CACHES: dict[str, Callable[[CacheSet, tuple], None]] = {"stack": lambda caches, key: None, "dynamic": use_transformers_cache}


@dataclass
class TargetPass:
    hidden: torch.Tensor  # [n, d] trunk rows before the final norm (the DeepSeek chain's seed)
    logits: torch.Tensor  # [n - first_logit_row, V] horizon-1 logits: row i predicts the token after input first_logit_row + i
    more_horizons: Iterator[torch.Tensor]  # rows [1, n, d] of horizons 2, 3, … (computed on demand)
    ctx_for: Callable | None = None  # the pass's attention contexts, for draft stacks run after it
    first_logit_row: int = 0  # a prefill projects its last row only (V-wide logits of every prompt row are never read)

    def logits_at(self, row: int) -> torch.Tensor:
        """[V] the horizon-1 logits of input row `row`."""
        return self.logits[row - self.first_logit_row]


class CachedModel:
    """One sequence's decoding state: the model and the KV cache of every attention stack."""

    def __init__(self, model):
        self.model = model  # a lab.model.mtp.MTPModel, by its members: the core sits below the heads that MTPModel assembles
        cfg = model.trunk.cfg  # head stacks' width, heads and rotary base (a HF trunk derives them from its config)
        target_stacks = {("stack", i) for i in model.head.next_token_stacks()}
        family_of = lambda key: "target" if key == TRUNK or key in target_stacks else "draft"  # noqa: E731
        self.caches = CacheSet(cfg.d_model // cfg.n_heads, cfg.rope_base, family_of)
        refusal = model.trunk.decoding_refusal()
        require(refusal is None, "model", f"cannot decode with the harness: {refusal}")
        TRUNK_CACHES[model.trunk.cache_protocol](self.caches, TRUNK)
        self.device = next(model.parameters()).device

    @property
    def length(self) -> int:
        """Committed target rows (= tokens whose K/V the target holds)."""
        return self.caches.cache(TRUNK).committed

    def forward(self, tokens: list[int], shape=None, last_logits_only: bool = False) -> TargetPass:
        """Run the next-token path on `tokens` placed after the cached rows (rows stay provisional).

        With a draft tree `shape` (lab.decode_core.tree.TreeShape), token i is node i of the tree.
        `last_logits_only` (a prefill): project the last row only, as transformers' generate does.
        """
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)[None]  # [1, n]
        ctx_for = self.caches.contexts(len(tokens), self.device, shape)
        hidden = self.model.trunk(ids, ctx_for(TRUNK))  # [1, n, d]
        rows = self.model.head.horizon_rows(hidden, ctx_for)
        first = len(tokens) - 1 if last_logits_only else 0
        logits = self.model.horizon_logits(1, next(rows)[0, first:])  # [n - first, V]
        return TargetPass(hidden[0], logits, rows, ctx_for, first)

    def commit(self, n: int | None = None, family: str | None = "target") -> None:
        self.caches.record_peaks()
        self.caches.commit(n, family)

    def commit_rows(self, rows: list[int], family: str | None = "target") -> None:
        """Commit the pass's rows `rows` (a root-to-node path of a tree pass) and drop its other rows."""
        self.caches.record_peaks()
        self.caches.commit_rows(rows, family)

"""Key/value caches for incremental decoding, one per attention stack.

The trunk, every head block stack and every DeepSeek draft step own separate K/V: the
same token prefix gives different keys under different weights (and under the same
weights fed different inputs), so caches are never shared (docs/decoding.md).

A cache holds rows for positions 0 .. length-1 of one sequence (batch 1 in practice; the
batched draft stack of independent heads keeps its heads on the batch axis).
The first `committed` rows are canonical state; rows after them are provisional (a
verification branch, or draft rows that consumed proposed tokens) until the caller
commits some of them or discards them. Only the caller knows which rows were verified,
so nothing is committed implicitly. A tree pass appends one row per tree node; the
accepted root-to-node path is committed by moving its rows up to follow the committed
prefix (`commit_rows`), and every sibling row is dropped.
"""

from __future__ import annotations

import torch

from lab.nn.blocks import AttentionContext, rotary_angles


class StackCache:
    """K/V of every attention layer of one block stack, in preallocated, growing buffers."""

    def __init__(self, key, family: str):
        self.key, self.family = key, family
        self.layers: dict = {}  # layer key (its attention module, or a transformers layer_idx) -> layer index, in call order
        self.keys: list[torch.Tensor] = []  # per layer [B, H, capacity, hd]
        self.values: list[torch.Tensor] = []
        self.lengths: list[int] = []  # rows written per layer (equal between forwards)
        self.committed = 0

    @property
    def length(self) -> int:
        """Rows held (committed + provisional); layers agree on it between forwards."""
        return self.lengths[0] if self.lengths else self.committed

    @property
    def provisional(self) -> int:
        return self.length - self.committed

    def extend(self, attention, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append new rows [B, H, n, hd] to layer `attention` (a module, keyed by identity, or an int layer index);
        return all rows [B, H, length + n, hd]."""
        layer = self.layers.setdefault(attention, len(self.layers))
        if layer == len(self.keys):  # first call of this layer: its buffers
            capacity = max(64, 2 * k.shape[2])
            self.keys.append(k.new_empty(*k.shape[:2], capacity, k.shape[3]))
            self.values.append(v.new_empty(*v.shape[:2], capacity, v.shape[3]))
            self.lengths.append(0)
        start, n = self.lengths[layer], k.shape[2]
        if start + n > self.keys[layer].shape[2]:
            self.keys[layer], self.values[layer] = (self._grown(t, start + n) for t in (self.keys[layer], self.values[layer]))
        self.keys[layer][:, :, start : start + n] = k  # [B, H, n, hd] into rows start..start+n-1
        self.values[layer][:, :, start : start + n] = v
        self.lengths[layer] = start + n
        return self.keys[layer][:, :, : start + n], self.values[layer][:, :, : start + n]  # [B, H, start+n, hd]

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` [b'] of every layer's buffers (a batch whose other requests have finished)."""
        self.keys = [t.index_select(0, index) for t in self.keys]  # [b', H, capacity, hd]
        self.values = [t.index_select(0, index) for t in self.values]

    @staticmethod
    def _grown(buffer: torch.Tensor, needed: int) -> torch.Tensor:
        bigger = buffer.new_empty(*buffer.shape[:2], max(needed, 2 * buffer.shape[2]), buffer.shape[3])
        bigger[:, :, : buffer.shape[2]] = buffer
        return bigger

    def commit(self, n: int | None = None) -> None:
        """Make the first `n` provisional rows canonical (all when None) and drop the rest."""
        n = self.provisional if n is None else n
        if not 0 <= n <= self.provisional:
            raise ValueError(f"cache {self.key}: cannot commit {n} of {self.provisional} provisional rows")
        self.committed += n
        self.lengths = [self.committed] * len(self.lengths)

    def discard(self) -> None:
        """Drop every provisional row (the committed prefix is untouched)."""
        self.commit(0)

    def commit_rows(self, rows: list[int]) -> None:
        """Commit provisional rows `rows` (offsets after the committed prefix, increasing), in that order; drop the rest.

        A tree pass's accepted path: its rows move up to follow the committed prefix, so
        they hold the positions their rotary angles were computed at (node depth = offset).
        """
        if rows == list(range(len(rows))):
            return self.commit(len(rows))  # a prefix (chain decoding): nothing moves
        if any(not 0 <= r < self.provisional for r in rows) or any(a >= b for a, b in zip(rows, rows[1:])):
            raise ValueError(f"cache {self.key}: rows {rows} are not increasing offsets into {self.provisional} provisional rows")
        start = self.committed
        index = torch.tensor(rows, device=self.keys[0].device) + start  # [a]: absolute rows of the path
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[:, :, start : start + len(rows)] = buffer.index_select(2, index)  # [B, H, a, hd]; a copy, so overlap is safe
        self.commit(len(rows))

    def row_bytes(self) -> int:
        """Bytes one row occupies across all layers (K and V); fixed once every layer has run (asked every round)."""
        if getattr(self, "_row_bytes", (None,))[0] != len(self.keys):
            # K and V apart: a latent-attention (MLA) layer keeps its latent as K and its narrower rotary key as V
            self._row_bytes = (len(self.keys), sum(t.shape[0] * t.shape[1] * t.shape[3] * t.element_size() for t in self.keys + self.values))
        return self._row_bytes[1]


class CacheSet:
    """All stack caches of one sequence, created on first use; builds their attention contexts.

    `family_of(key)` says whose state a cache is: "target" (the next-token path, the
    model that verifies) or "draft" (head stacks of horizons ≥ 2, DeepSeek draft steps).
    """

    def __init__(self, head_dim: int, rope_base: float, family_of):
        self.head_dim, self.rope_base, self.family_of = head_dim, rope_base, family_of
        self.caches: dict = {}
        self.peak_bytes = {"target": 0, "draft": 0, "branch_peak": 0}
        self._cos = self._sin = None  # [1, 1, P, hd/2] rotary table for positions 0..P-1, grown on demand
        self._masks: dict = {}  # n -> [1, 1, n, W] right-aligned causal table; tree shape -> its table

    def cache(self, key) -> StackCache:
        if key not in self.caches:
            self.caches[key] = StackCache(key, self.family_of(key))
        return self.caches[key]

    def _rotary(self, start: int, n_rows: int, device):
        """cos, sin [1, 1, n, hd/2] of positions start..start+n-1 (one table: every stack and step reuses it)."""
        if self._cos is None or start + n_rows > self._cos.shape[2]:
            size = max(256, 2 * (start + n_rows))
            self._cos, self._sin = rotary_angles(torch.arange(size, device=device)[None], self.head_dim, self.rope_base)  # [1, 1, size, hd/2]
        return self._cos[:, :, start : start + n_rows], self._sin[:, :, start : start + n_rows]  # [1, 1, n, hd/2] each

    def _mask(self, start: int, n_rows: int, device):
        """Row i (position start+i) sees every cached key and the new keys up to itself; None for one row.

        A view of one right-aligned table per row count (row i sees keys ≤ width − n + i), so a
        round builds no mask: the last start+n columns are exactly this pass's mask.
        """
        if n_rows == 1:
            return None
        table = self._masks.get(n_rows)
        if table is None or table.shape[-1] < start + n_rows:
            width = max(256, 2 * (start + n_rows))
            table = torch.ones(n_rows, width, dtype=torch.bool, device=device).tril(width - n_rows)[None, None]  # [1, 1, n, width]
            self._masks[n_rows] = table
        return table[..., table.shape[-1] - start - n_rows :]  # [1, 1, n, start+n]

    def _tree_mask(self, start: int, shape, device):
        """[1, 1, n, start+n]: node i sees every cached key, its ancestors and itself (never a sibling branch).

        Like `_mask`, a view of one right-aligned table per tree: [all cached keys | ancestor mask].
        """
        table = self._masks.get(shape)
        if table is None or table.shape[-1] < start + shape.size:
            width = max(256, 2 * (start + shape.size))
            cached = torch.ones(shape.size, width - shape.size, dtype=torch.bool, device=device)  # [n, W-n]
            table = self._masks[shape] = torch.cat([cached, shape.ancestor_mask(device)], dim=1)[None, None]  # [1, 1, n, W]
        return table[..., table.shape[-1] - start - shape.size :]  # [1, 1, n, start+n]

    def tree_context(self, key, shape, device) -> AttentionContext:
        """Context for the nodes of draft tree `shape` (node 0 = the frontier) appended to stack `key`.

        Node i sits at position start + depth(i); a chain-shaped tree is the ordinary causal context.
        """
        if shape.is_chain:
            return self.context(key, shape.size, device)
        cache = self.cache(key)
        start = cache.length
        self._rotary(start, shape.depth + 1, device)  # grow the table to cover the deepest node
        positions = self._tree_depths(shape, device) + start  # [n]
        cos, sin = self._cos[:, :, positions], self._sin[:, :, positions]  # [1, 1, n, hd/2] each
        # position_ids: transformers layers (an HF trunk, native head blocks) compute their rotary angles from them
        return AttentionContext(self._tree_mask(start, shape, device), cos, sin, kv=cache, position_ids=positions[None])  # [1, n]

    def _tree_depths(self, shape, device) -> torch.Tensor:
        """[n] node depths of `shape`, built once per tree."""
        key = ("depths", shape)
        if key not in self._masks:
            self._masks[key] = torch.tensor(shape.depths, device=device)
        return self._masks[key]

    def context(self, key, n_rows: int, device) -> AttentionContext:
        """Context for `n_rows` new rows appended to stack `key`: one document, positions continue."""
        cache = self.cache(key)
        start = cache.length
        cos, sin = self._rotary(start, n_rows, device)
        mask = None if getattr(cache, "builds_causal_mask", False) else self._mask(start, n_rows, device)  # a prefill's would be [n, 2n]
        return AttentionContext(mask, cos, sin, kv=cache)

    def contexts(self, n_rows: int, device, shape=None):
        """`ctx_for(key)` for one forward over `n_rows` new rows (or the nodes of tree `shape`) in every stack it touches."""
        if shape is not None:
            return lambda key: self.tree_context(key, shape, device)
        return lambda key: self.context(key, n_rows, device)

    def commit(self, n: int | None = None, family: str | None = None) -> None:
        for cache in self.caches.values():
            if family is None or cache.family == family:
                cache.commit(n)

    def commit_rows(self, rows: list[int], family: str | None = None) -> None:
        for cache in self.caches.values():
            if family is None or cache.family == family:
                cache.commit_rows(rows)

    def discard(self, family: str | None = None) -> None:
        for cache in self.caches.values():
            if family is None or cache.family == family:
                cache.discard()

    def record_peaks(self) -> None:
        """Update the byte peaks from the rows held now (call after each forward)."""
        for family in ("target", "draft"):
            held = sum(c.length * c.row_bytes() for c in self.caches.values() if c.family == family)
            self.peak_bytes[family] = max(self.peak_bytes[family], held)
        branch = sum(c.provisional * c.row_bytes() for c in self.caches.values() if c.family == "target")
        self.peak_bytes["branch_peak"] = max(self.peak_bytes["branch_peak"], branch)

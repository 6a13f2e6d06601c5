"""The trunk cache of a transformers trunk (model=hf): transformers' own `DynamicCache` inside the
harness's cache transaction (lab/decode_core/cache.py).

It answers what `StackCache` answers (committed, length, provisional, commit, discard,
row_bytes), so `CacheSet` and the decoders treat it like any other stack cache. A forward
appends its rows provisionally; `commit(n)` keeps the first n of them and removes the rest
with `DynamicCache.crop`, so only target-verified rows ever stay.
"""

from __future__ import annotations

import torch


class HFTrunkCache:
    builds_causal_mask = True  # rows in order after the cache: transformers builds the causal mask (and picks its causal kernel)

    def __init__(self, key, family: str):
        from transformers import DynamicCache

        self.key, self.family = key, family
        self.dynamic = DynamicCache()
        self.committed = 0

    @property
    def length(self) -> int:
        return self.dynamic.get_seq_length()

    @property
    def provisional(self) -> int:
        return self.length - self.committed

    def forward_arguments(self, n_rows: int, mask: torch.Tensor | None, device, position_ids: torch.Tensor | None = None) -> dict:
        """What the HF base model takes to append `n_rows` rows after the cached ones: positions continue, or
        `position_ids` [1, n] (a draft tree's nodes sit at their depth after the cached rows)."""
        if position_ids is None:
            start = self.length
            position_ids = self._positions(start + n_rows, device)[:, start:]  # [1, n]
        return {"cache": self.dynamic, "use_cache": True, "attention_mask": mask, "position_ids": position_ids}

    def _positions(self, end: int, device) -> torch.Tensor:
        """[1, ≥ end] positions 0.. (one table, grown by doubling: a round slices it instead of building one)."""
        table = getattr(self, "_table", None)
        if table is None or table.shape[1] < end:
            table = self._table = torch.arange(max(256, 2 * end), device=device)[None]
        return table[:, :end]

    def commit(self, n: int | None = None) -> None:
        """Make the first `n` provisional rows canonical (all when None) and remove the rest from the cache."""
        n = self.provisional if n is None else n
        if not 0 <= n <= self.provisional:
            raise ValueError(f"cache {self.key}: cannot commit {n} of {self.provisional} provisional rows")
        self.committed += n
        rejected = self.length - self.committed
        if rejected:
            self.dynamic.crop(-rejected)  # transformers 5: crop(-n) removes the last n rows

    def discard(self) -> None:
        self.commit(0)

    def commit_rows(self, rows: list[int]) -> None:
        """Commit provisional rows `rows` (increasing offsets after the committed prefix) in that order; drop the rest.

        A tree pass's accepted path: its K/V rows move up to follow the committed prefix (their rotary
        angles were computed at the node depths, which are exactly these positions), then the cache is
        cropped, so the siblings' rows are gone. A chain's prefix moves nothing.
        """
        if rows != list(range(len(rows))):
            if any(not 0 <= r < self.provisional for r in rows) or any(a >= b for a, b in zip(rows, rows[1:])):
                raise ValueError(f"cache {self.key}: rows {rows} are not increasing offsets into {self.provisional} provisional rows")
            start = self.committed
            for layer in self.dynamic.layers:
                index = torch.tensor(rows, device=layer.keys.device) + start  # [a]: absolute rows of the path
                for buffer in (layer.keys, layer.values):  # [B, H, rows, hd]
                    buffer[:, :, start : start + len(rows)] = buffer.index_select(2, index)  # a copy, so overlap is safe
        self.commit(len(rows))

    def row_bytes(self) -> int:
        total = 0
        for layer in self.dynamic.layers:
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if isinstance(keys, torch.Tensor) and keys.dim() == 4:  # [B, H, rows, hd]
                total += sum(t.shape[0] * t.shape[1] * t.shape[3] * t.element_size() for t in (keys, values))
        return total


def use_transformers_cache(caches, key) -> None:
    """Give the stack `key` of a CacheSet transformers' cache (the HF trunk's)."""
    caches.caches[key] = HFTrunkCache(key, caches.family_of(key))

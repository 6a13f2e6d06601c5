"""The trunk cache of a transformers trunk (model=hf): transformers' own `DynamicCache` inside the
harness's cache transaction (lab/decode/cache.py).

It answers what `StackCache` answers (committed, length, provisional, commit, discard,
row_bytes), so `CacheSet` and the decoders treat it like any other stack cache. A forward
appends its rows provisionally; `commit(n)` keeps the first n of them and removes the rest
with `DynamicCache.crop`, so only target-verified rows ever stay.
"""

from __future__ import annotations

import torch


class HFTrunkCache:
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

    def forward_arguments(self, n_rows: int, mask: torch.Tensor | None, device) -> dict:
        """What the HF base model takes to append `n_rows` rows after the cached ones (positions continue)."""
        start = self.length
        return {"cache": self.dynamic, "use_cache": True, "attention_mask": mask,
                "position_ids": torch.arange(start, start + n_rows, device=device)[None]}  # [1, n]

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
        """Commit provisional rows `rows` (increasing offsets after the committed prefix); chains commit a prefix.

        A tree's path would need per-node positions in transformers' attention, which this cache does
        not give (trees on HF trunks are refused in lab.decode.generate): any other row set is an error.
        """
        if rows != list(range(len(rows))):
            raise ValueError(f"cache {self.key}: transformers' cache commits a prefix of its provisional rows, not rows {rows}")
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

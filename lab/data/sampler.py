"""The training sampler: a shuffle that is a pure function of (seed, epoch) and can start mid-epoch.

`data.shuffle=false` keeps the rows in stream order (same resume rule).

Exact resume needs the interrupted run's next batch. Lightning restores the loop
counters but not a plain DataLoader's position, and a shuffling generator created
afresh would replay epoch 0's order. This sampler derives each epoch's permutation
from `seed + epoch` (Lightning calls `set_epoch` with the restored epoch) and skips
the batches already consumed in that epoch.

It is a `DistributedSampler`, so under DDP Lightning keeps it instead of injecting
its own; on one process it is rank 0 of 1.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler


class ResumableSampler(DistributedSampler):
    def __init__(self, dataset: Dataset, *, seed: int, batch_size: int, shuffle: bool = True):
        distributed = dist.is_available() and dist.is_initialized()
        super().__init__(
            dataset,
            num_replicas=dist.get_world_size() if distributed else 1,
            rank=dist.get_rank() if distributed else 0,
            shuffle=shuffle,  # off: rows in stream order (rank k takes k, k+W, …)
            seed=seed,
            drop_last=True,
        )
        self.batch_size = batch_size
        self._skip = 0  # samples to drop from the next epoch only

    @property
    def batches_per_epoch(self) -> int:
        return self.num_samples // self.batch_size  # the loader drops the last partial batch

    def resume_at(self, step: int) -> None:
        """Continue after `step` optimizer steps (one batch each): skip what this epoch already used."""
        self._skip = (step % self.batches_per_epoch) * self.batch_size if self.batches_per_epoch else 0

    def __iter__(self):
        indices = list(super().__iter__())
        skip, self._skip = self._skip, 0
        return iter(indices[skip:])

"""The DataLoaders every packed-rows DataModule shares: the resumable training order and DDP-exact validation.

A subclass provides `config` (with `seed`, `batch_size`, `shuffle`, `num_workers`) and
`prepare()`, which sets `self._prepared` to a record with `train_rows` / `val_rows` (map-style
rows, or with `streaming` the `StreamingRows` of lab/data/streaming.py) and `corpus_stats`; the
base serves them and refuses to before prepare(). Batches are dicts of [B, S] tensors (docs/tensor-conventions.md).
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader

from lab.data.sampler import ResumableSampler
from lab.errors import require


class RowsDataModule(pl.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        self._prepared = None  # what the subclass's prepare() built: train_rows, val_rows, corpus_stats, …

    # ------------------------------------------------------- results of prepare()

    @property
    def train_rows(self):
        return self._require_prepared().train_rows

    @property
    def val_rows(self):
        return self._require_prepared().val_rows

    @property
    def corpus_stats(self) -> dict:
        """What the data set is made of (LM: n_docs/n_bytes/n_tokens/n_rows per split and the unigram entropy)."""
        return self._require_prepared().corpus_stats

    def _require_prepared(self):
        if self._prepared is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() (or prepare()) before reading its data")
        return self._prepared

    # ------------------------------------------------------------ streaming, replaced rows

    @property
    def streaming(self) -> bool:
        return bool(getattr(self.config, "streaming", False))

    @property
    def training_rows(self):
        """The rows training batches come from: `train_rows`, or what `train_from` put in their place."""
        replaced = getattr(self, "_training_rows", None)
        return self.train_rows if replaced is None else replaced

    def train_from(self, rows) -> None:
        """Training batches from `rows`: the training rows in the same order with more columns (e.g. the frozen
        trunk's hidden states, lab/training/hidden_cache.py); validation keeps `val_rows`."""
        require(not self.streaming and len(rows) == len(self.train_rows), "data.streaming",
                "training rows can only be replaced row for row on an indexed (non-streaming) split")
        self._training_rows = rows

    # ------------------------------------------------------------ Lightning hooks

    def prepare_data(self) -> None:
        self.prepare()

    def setup(self, stage: str | None = None) -> None:
        self.prepare()

    def train_dataloader(self) -> DataLoader:
        # The order is a function of (seed, epoch); a resumed fit starts at the restored
        # step (one batch per optimizer step), so it sees the batches the interrupted run would have.
        step = self.trainer.global_step if self.trainer is not None else 0
        if self.streaming:
            return self._loader(self.train_rows.resumed_at(step), sampler=None, drop_last=False)
        sampler = ResumableSampler(
            self.training_rows, seed=self.config.seed, batch_size=self.config.batch_size, shuffle=self.config.shuffle
        )
        sampler.resume_at(step)
        return self._loader(self.training_rows, sampler=sampler, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_rows, sampler=self._validation_sampler(), drop_last=False)

    def _validation_sampler(self) -> UnrepeatedDistributedSampler | None:
        """Under DDP each rank validates rows rank, rank + W, …: every row exactly once.

        Lightning's default DistributedSampler pads the set with repeated rows when the rows
        don't divide by the world size; the per-horizon sums are all-reduced afterwards, so a
        repeat would be counted twice. Being a DistributedSampler, this one is kept as is.
        A streamed validation set (`data.streaming=true`) takes no sampler: StreamingRows splits
        it the same way itself (rank k takes rows k, k + W, …).
        """
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1 or self.streaming:
            return None  # sequential
        world = dist.get_world_size()
        require(
            len(self.val_rows) >= world,
            "data.max_val_rows",
            f"validation packs into {len(self.val_rows)} rows, fewer than the {world} ranks; every rank needs ≥ 1 row",
        )
        return UnrepeatedDistributedSampler(self.val_rows, num_replicas=world, rank=dist.get_rank(), shuffle=False)

    def _loader(self, rows, *, sampler, drop_last) -> DataLoader:
        workers = self.config.num_workers
        return DataLoader(
            rows,
            batch_size=self.config.batch_size,
            sampler=sampler,  # None: sequential (validation) or the stream's own order
            # A loader draws its worker seed from this generator, never from the global RNG, so a resumed
            # run (Lightning skips the validation due at its checkpoint) keeps the RNG streams aligned.
            generator=torch.Generator().manual_seed(self.config.seed),
            drop_last=drop_last,
            num_workers=workers,
            persistent_workers=workers > 0,
        )

"""Packed rows from a `datasets.IterableDataset`: for corpora too large to tokenize and store.

Documents are read lazily, tokenized in batches, concatenated and cut into rows with the
same `pack_row` as the memory-mapped path, so with the shuffle off the row stream equals
`MappedRows` row by row (except the tiny-corpus split corner case, see sources.py).

Training order, mirroring `ResumableSampler` + `DataLoader(drop_last=True)` on the mapped rows:

- epoch e reads the documents in file order, or (shuffle on) through `datasets`' shuffle
  buffer with seed `seed + e` (`IterableDataset.set_epoch`); epochs repeat without end
  (`trainer.max_steps` stops training);
- under DDP rank k takes rows k, k+W, … of every complete group of W rows, then cuts its
  rows into batches and drops the epoch's last partial batch;
- resume skips the first `skip_batches` batches of this rank: the stream is re-read and
  re-tokenized up to that point (exact, costs time proportional to the skipped data);
- with DataLoader workers, worker w yields the batches i ≡ w (mod workers) counted from
  the resume point, which is the order the DataLoader takes them in (every worker reads
  the whole stream).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import datasets
import numpy as np
import torch
import torch.distributed as dist

from lab.data.packing import pack_row
from lab.errors import ConfigError

_TOKENIZE_BATCH = 256


class StreamingRows(torch.utils.data.IterableDataset):
    def __init__(
        self,
        docs: datasets.IterableDataset,
        tokenizer,
        *,
        seq_len: int,
        batch_size: int,
        train: bool,
        seed: int = 0,
        shuffle: bool = False,
        shuffle_buffer: int = 10_000,
        skip_batches: int = 0,
        max_rows: int | None = None,
    ):
        """`train`: repeat epochs, split over DDP ranks, drop partial batches; else one pass, every row."""
        self.docs = docs
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.train = train
        self.seed = seed
        self.shuffle = shuffle
        self.shuffle_buffer = shuffle_buffer
        self.skip_batches = skip_batches
        self.max_rows = max_rows

    def resumed_at(self, step: int) -> StreamingRows:
        """The same stream continuing after `step` batches of this rank (one per optimizer step)."""
        clone = StreamingRows.__new__(StreamingRows)
        clone.__dict__.update(self.__dict__, skip_batches=step)
        return clone

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        worker, n_workers = (0, 1) if info is None else (info.id, info.num_workers)
        rows = itertools.islice(self._rank_rows(), self.max_rows)
        for index, batch in enumerate(itertools.islice(self._batches(rows), self.skip_batches, None)):
            if index % n_workers == worker:
                yield from batch

    # ------------------------------------------------------------------ layers

    def _batches(self, rows) -> Iterator[list[dict]]:
        """This rank's rows in batch groups; in training the partial batch at each epoch end is dropped."""
        batch: list[dict] = []
        for row in rows:
            if row is _EPOCH_END:
                batch = []
                continue
            batch.append(row)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def _rank_rows(self) -> Iterator[dict]:
        """Rows of this rank, with `_EPOCH_END` between training epochs."""
        distributed = dist.is_available() and dist.is_initialized()
        world, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
        if not self.train:
            # Validation: the first max_rows rows of the stream, rank k taking rows k, k+W, k+2W, …, so
            # every row is validated exactly once over the ranks (shares may differ by one row).
            yield from itertools.islice(itertools.islice(self._epoch_rows(0), self.max_rows), rank, None, world)
            return
        for epoch in itertools.count():
            group: list[dict] = []
            n_rows = 0
            for row in self._epoch_rows(epoch):
                group.append(row)
                if len(group) == world:  # a complete group of W rows: rank k takes row k
                    yield group[rank]
                    n_rows += 1
                    group = []
            if n_rows < self.batch_size:
                raise ConfigError(
                    "data.batch_size",
                    f"the training stream packs into fewer than batch_size {self.batch_size} rows per rank "
                    f"(no full batch); lower batch_size or seq_len, or add documents",
                )
            yield _EPOCH_END

    def _epoch_rows(self, epoch: int) -> Iterator[dict]:
        """One pass: tokenize documents in order, append EOS, cut `seq_len` rows; the last row is padded."""
        docs = self.docs
        if self.shuffle:
            docs = docs.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer)
            docs.set_epoch(epoch)  # datasets reshuffles with seed + epoch
        eos = np.array([self.tokenizer.eos_id], dtype=np.int64)
        pending = np.zeros(0, dtype=np.int64)  # tokens not yet in a row
        starts = np.zeros(0, dtype=np.int64)  # document starts inside `pending`
        for batch in docs.iter(batch_size=_TOKENIZE_BATCH):
            encoded = [np.concatenate([ids.astype(np.int64), eos]) for ids in self.tokenizer.encode_batch(batch["text"])]
            lengths = np.array([e.size for e in encoded], dtype=np.int64)
            starts = np.concatenate([starts, pending.size + np.cumsum(lengths) - lengths])
            pending = np.concatenate([pending, *encoded])
            n_full = pending.size // self.seq_len
            for r in range(n_full):
                lo, hi = r * self.seq_len, (r + 1) * self.seq_len
                inside = starts[(starts > lo) & (starts < hi)] - lo
                yield pack_row(pending[lo:hi], inside, self.seq_len, self.tokenizer.pad_id)
            cut = n_full * self.seq_len
            pending, starts = pending[cut:], starts[starts >= cut] - cut
        if pending.size:
            inside = starts[starts > 0]
            yield pack_row(pending, inside, self.seq_len, self.tokenizer.pad_id)


_EPOCH_END = object()

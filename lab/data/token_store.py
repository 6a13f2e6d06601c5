"""Packed rows read from disk: the tokenized stream stays in `datasets`' memory-mapped cache.

`tokenize_documents` writes one split's documents once (Arrow, `ids` as uint16 or uint32
lists); Arrow stores a list column as one flat values buffer plus int32 offsets, which is
exactly "the token stream plus document boundaries". `TokenStream` reads those buffers
zero-copy from the memory-mapped files and keeps in RAM only the document start offsets
(8 bytes per document). `MappedRows` builds row `r` on demand from the stream slice
`[r*S, (r+1)*S)` with `pack_row`, so nothing grows with the corpus but page cache.

Both pickle by file path (DataLoader workers, DDP ranks re-open the same cache files).
"""

from __future__ import annotations

import math

import datasets
import numpy as np
import pyarrow.compute as pc
import torch

from lab.data.packing import COLUMNS, pack_row


class TokenStream:
    """One split's documents, concatenated in order (each ends with EOS), as a flat id stream."""

    def __init__(self, tokenized: datasets.Dataset):
        # An indices mapping would reorder rows away from the Arrow buffers this reads.
        assert tokenized._indices is None, "TokenStream needs the dataset that map() wrote, without select/shuffle"
        self.tokenized = tokenized
        lengths = [pc.list_value_length(chunk).to_numpy(zero_copy_only=False) for chunk in self._ids_chunks()]
        lengths = np.concatenate(lengths).astype(np.int64) if lengths else np.zeros(0, np.int64)  # [D]
        lengths = lengths[lengths > 0]  # an empty document has no tokens and no occurrence
        self.doc_starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths)])  # [D+1], last = n_tokens
        self._views: tuple[list[np.ndarray], np.ndarray] | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.doc_starts[-1])

    @property
    def n_docs(self) -> int:
        return self.doc_starts.size - 1

    def _ids_chunks(self):
        return self.tokenized.data.column("ids").chunks

    def chunks(self) -> tuple[list[np.ndarray], np.ndarray]:
        """(views, starts): the stream as zero-copy numpy views on the mapped file, and each view's stream offset."""
        if self._views is None:
            views = [chunk.flatten().to_numpy(zero_copy_only=True) for chunk in self._ids_chunks()]
            views = [v for v in views if v.size]
            sizes = np.array([v.size for v in views], dtype=np.int64)
            self._views = views, np.concatenate([np.zeros(1, np.int64), np.cumsum(sizes)])  # [n_chunks+1]
        return self._views

    def window(self, start: int, stop: int) -> np.ndarray:
        """[stop-start] int64: stream ids start..stop-1 (a copy; may span Arrow chunks)."""
        views, offsets = self.chunks()
        out = np.empty(stop - start, dtype=np.int64)
        chunk = int(np.searchsorted(offsets, start, side="right")) - 1
        filled = 0
        while filled < out.size:
            begin = start + filled - offsets[chunk]
            piece = views[chunk][begin : begin + out.size - filled]
            out[filled : filled + piece.size] = piece
            filled += piece.size
            chunk += 1
        return out

    def starts_inside(self, start: int, stop: int) -> np.ndarray:
        """Document starts s with start < s < stop, relative to `start`."""
        lo = np.searchsorted(self.doc_starts, start, side="right")
        hi = np.searchsorted(self.doc_starts, stop, side="left")
        return self.doc_starts[lo:hi] - start

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_views"] = None  # views point into this process's mapping; the Dataset pickles by path
        return state


class MappedRows(torch.utils.data.Dataset):
    """Rows of `seq_len` tokens built on the fly; an item is a dict of four [S] tensors (docs/tensor-conventions.md)."""

    def __init__(self, stream: TokenStream, seq_len: int, pad_id: int, n_rows: int | None = None):
        self.stream = stream
        self.seq_len = seq_len
        self.pad_id = pad_id
        total = math.ceil(stream.n_tokens / seq_len)
        self.n_rows = total if n_rows is None else min(n_rows, total)

    def __len__(self) -> int:
        return self.n_rows

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.n_rows:
            raise IndexError(f"row {index} out of range for {self.n_rows} rows")
        start = index * self.seq_len
        stop = min(start + self.seq_len, self.stream.n_tokens)
        return pack_row(self.stream.window(start, stop), self.stream.starts_inside(start, stop), self.seq_len, self.pad_id)

    def head(self, n_rows: int | None) -> MappedRows:
        """The first `n_rows` rows (all when None): a deterministic cap for fast evaluation."""
        return self if n_rows is None else MappedRows(self.stream, self.seq_len, self.pad_id, min(n_rows, self.n_rows))

    def as_dict(self) -> dict[str, torch.Tensor]:
        """Every row stacked, each [N, S]: materialises the split (for tests and small corpora)."""
        rows = [self[i] for i in range(len(self))]
        return {name: torch.stack([row[name] for row in rows]) if rows else torch.zeros(0, self.seq_len) for name in COLUMNS}

    def __repr__(self) -> str:
        return f"MappedRows(n_rows={len(self)}, seq_len={self.seq_len}, n_tokens={self.stream.n_tokens})"

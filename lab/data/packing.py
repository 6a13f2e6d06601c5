"""Packing: tokenized documents → fixed-length rows with the columns of docs/tensor-conventions.md.

Rules (also in docs/tensor-conventions.md):

- Every document is followed by EOS, and the EOS belongs to the document it ends.
  No BOS is inserted: EOS already separates documents, attention never crosses them,
  and a continuation row could not start with a BOS anyway. (The tokenizers still
  define a BOS id for generation.)
- Documents are concatenated in order and cut into rows of exactly `seq_len` tokens.
  Only the last row of the stream is padded (PAD id, active False, segment -1,
  position 0).
- `segment_ids` number the document occurrences inside a row 0, 1, 2, …; a document
  that continues from the previous row is occurrence 0 of the new row.
- `position_ids` restart at 0 at every occurrence, the continuation at a row start
  included: a document longer than a row continues in the next row as a new occurrence.

Row `r` is therefore a pure function of the stream tokens `[r*S, (r+1)*S)` and of where
documents start inside that window. `pack_row` builds one row from exactly that (the
training path: memory-mapped and streaming rows); `pack_stream` packs a whole in-memory
stream at once and stays as the reference the tests hold `pack_row` equal to.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from lab.errors import require_int

COLUMNS = ("tokens", "active", "segment_ids", "position_ids")
_MAP_BATCH = 256
UINT16_VOCAB = 1 << 16


def token_dtype(vocab_size: int) -> str:
    """The smallest unsigned dtype that holds every id < vocab_size (stored ids cost 2 or 4 bytes)."""
    return "uint16" if vocab_size <= UINT16_VOCAB else "uint32"


def tokenized_features(vocab_size: int) -> datasets.Features:
    """`ids`: one document's ids ending with EOS; `n_bytes`: the document's UTF-8 size."""
    return datasets.Features(
        {"ids": datasets.List(datasets.Value(token_dtype(vocab_size))), "n_bytes": datasets.Value("int64")}
    )


class PackedRows(torch.utils.data.Dataset):
    """Packed rows as four [N, S] tensors; an item is a dict of four [S] tensors."""

    def __init__(
        self, tokens: torch.Tensor, active: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor
    ):
        shape = tokens.shape
        assert tokens.dim() == 2 and all(t.shape == shape for t in (active, segment_ids, position_ids)), shape
        self.tokens = tokens  # [N, S] long
        self.active = active  # [N, S] bool
        self.segment_ids = segment_ids  # [N, S] long
        self.position_ids = position_ids  # [N, S] long

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name)[index] for name in COLUMNS}  # each [S]

    def head(self, n_rows: int | None) -> PackedRows:
        """The first `n_rows` rows (all when None): a deterministic cap for fast evaluation."""
        if n_rows is None:
            return self
        return PackedRows(*(getattr(self, name)[:n_rows] for name in COLUMNS))

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in COLUMNS}  # each [N, S]

    def __repr__(self) -> str:
        return f"PackedRows(n_rows={len(self)}, seq_len={self.seq_len})"


# ------------------------------------------------------------------- tokenizing


def tokenize_documents(
    docs: datasets.Dataset,
    tokenizer,
    *,
    cache_file: str | os.PathLike | None = None,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """One row per document: `ids` (`token_dtype`, ending with EOS) and `n_bytes` (UTF-8 size of the text).

    With `cache_file`, the result is written there by `Dataset.map` (in `num_proc` shards
    when > 1) and reused when it exists, so the caller must key the name by corpus and tokenizer.
    """
    fingerprint = _map_fingerprint(docs, tokenizer)
    if cache_file is not None:
        Path(cache_file).parent.mkdir(parents=True, exist_ok=True)
    return docs.map(
        encode_batch,
        batched=True,
        batch_size=_MAP_BATCH,
        fn_kwargs={"tokenizer": tokenizer},
        input_columns=["text"],
        remove_columns=docs.column_names,
        features=tokenized_features(tokenizer.vocab_size),
        cache_file_name=None if cache_file is None else str(cache_file),
        num_proc=num_proc if num_proc and num_proc > 1 else None,
        # Given explicitly, so `datasets` need not hash the tokenizer object.
        new_fingerprint=fingerprint,
        desc="tokenize",
    )


def encode_batch(texts: list[str], tokenizer) -> dict:
    """`ids` per text (EOS appended, `token_dtype`) and its UTF-8 size."""
    dtype = token_dtype(tokenizer.vocab_size)
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    ids = [np.concatenate([doc.astype(dtype), eos]) for doc in tokenizer.encode_batch(texts)]
    return {"ids": ids, "n_bytes": [len(t.encode("utf-8")) for t in texts]}


def _map_fingerprint(docs: datasets.Dataset, tokenizer) -> str:
    payload = json.dumps([docs._fingerprint, tokenizer.identity], sort_keys=True)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:32]


def token_stream(tokenized: datasets.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """All ids concatenated in document order, and each document's length (int64)."""
    if len(tokenized) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ids = tokenized.with_format("arrow")[:]["ids"]  # indices mapping applied
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = ids.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    return flat, lengths


# ---------------------------------------------------------------------- packing


def pack_row(window: np.ndarray, doc_starts: np.ndarray, seq_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    """One packed row, each column [S], from its slice of the stream.

    window: [n] ids, n ≤ S (n < S only for the stream's last row, which is padded);
    doc_starts: increasing offsets in (0, n) where a document begins. The row start is always
    an occurrence start (a new document or the continuation of one), so it is not listed.
    """
    n = window.size
    starts = np.asarray(doc_starts, dtype=np.int64)
    new_occurrence = np.zeros(n, dtype=np.int64)
    new_occurrence[starts] = 1
    occurrence = np.cumsum(new_occurrence)  # [n]: 0 for the row's first occurrence, +1 at each start
    occurrence_start = np.concatenate([np.zeros(1, np.int64), starts])  # [n_occurrences]
    tokens = np.full(seq_len, pad_id, dtype=np.int64)
    tokens[:n] = window  # [S]; the tail of the last row stays PAD
    segment_ids = np.full(seq_len, -1, dtype=np.int64)
    segment_ids[:n] = occurrence  # [S]
    position_ids = np.zeros(seq_len, dtype=np.int64)
    position_ids[:n] = np.arange(n) - occurrence_start[occurrence]  # [n]: restart at every occurrence
    active = np.zeros(seq_len, dtype=bool)
    active[:n] = True  # [S]
    columns = {"tokens": tokens, "active": active, "segment_ids": segment_ids, "position_ids": position_ids}
    return {name: torch.from_numpy(columns[name]) for name in COLUMNS}


def pack_tokenized(tokenized: datasets.Dataset, seq_len: int, pad_id: int) -> PackedRows:
    flat, lengths = token_stream(tokenized)
    return pack_stream(flat, lengths, seq_len, pad_id)


def pack_documents(docs: Sequence[Sequence[int]], seq_len: int, pad_id: int) -> PackedRows:
    """Pack documents given as id lists that already end with EOS (handy for tests)."""
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    flat = np.concatenate([np.asarray(d, dtype=np.int64) for d in docs]) if docs else np.zeros(0, np.int64)
    return pack_stream(flat, lengths, seq_len, pad_id)


def check_seq_len(seq_len) -> None:
    require_int(seq_len, "data.seq_len", least=2)


def pack_stream(tokens: np.ndarray, doc_lengths: np.ndarray, seq_len: int, pad_id: int) -> PackedRows:
    """Cut the concatenated stream into rows; vectorised over the whole stream, all in memory (the reference)."""
    check_seq_len(seq_len)
    tokens = np.asarray(tokens, dtype=np.int64)
    lengths = np.asarray(doc_lengths, dtype=np.int64)
    lengths = lengths[lengths > 0]  # an empty document has no tokens and no occurrence
    assert lengths.sum() == tokens.size, (lengths.sum(), tokens.size)

    n_tokens = tokens.size
    n_rows = math.ceil(n_tokens / seq_len)
    padded = n_rows * seq_len
    doc_starts = np.cumsum(lengths) - lengths

    doc_index = np.full(padded, -1, dtype=np.int64)
    doc_index[:n_tokens] = np.repeat(np.arange(lengths.size), lengths)  # [T]: document of each stream token
    position_in_doc = np.zeros(padded, dtype=np.int64)
    position_in_doc[:n_tokens] = np.arange(n_tokens) - np.repeat(doc_starts, lengths)  # [T]
    padded_tokens = np.full(padded, pad_id, dtype=np.int64)
    padded_tokens[:n_tokens] = tokens  # [T] of [R*S]; the tail stays PAD

    doc_index = doc_index.reshape(n_rows, seq_len)  # [R, S]
    position_in_doc = position_in_doc.reshape(n_rows, seq_len)  # [R, S]
    active = doc_index >= 0  # [R, S]; only the last row can hold padding
    # Documents are contiguous in the stream, so the occurrences in a row are the row's
    # first document index, +1, +2, …; the first token of a row is never padding.
    segment_ids = np.where(active, doc_index - doc_index[:, :1], -1)  # [R, S] minus the row's first doc [R, 1]
    # The row's first occurrence restarts at 0 even when its document began earlier.
    position_ids = np.where(segment_ids == 0, position_in_doc - position_in_doc[:, :1], position_in_doc)  # [R, S]
    position_ids = np.where(active, position_ids, 0)  # [R, S]

    return PackedRows(
        tokens=torch.from_numpy(padded_tokens.reshape(n_rows, seq_len)),
        active=torch.from_numpy(active),
        segment_ids=torch.from_numpy(segment_ids),
        position_ids=torch.from_numpy(position_ids),
    )


# ------------------------------------------------------------------- statistics


def unigram_entropy_bits(tokens: np.ndarray, vocab_size: int | None = None) -> float:
    """Entropy of the empirical unigram distribution of `tokens`, in bits per token."""
    tokens = np.asarray(tokens, dtype=np.int64)
    return unigram_entropy_bits_from_counts(np.bincount(tokens, minlength=vocab_size or 0))


def unigram_entropy_bits_from_counts(counts: np.ndarray) -> float:
    """The same entropy from per-id counts (accumulated in chunks over a stream too big to hold)."""
    total = counts.sum()
    if total == 0:
        return 0.0
    probs = counts[counts > 0] / total
    return float(-(probs * np.log2(probs)).sum())

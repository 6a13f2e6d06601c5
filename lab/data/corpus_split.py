"""Selection and the train/validation split, shared by every corpus source (lab/data/sources.py).

Rules, so that a corpus is a pure function of its inputs:

1. documents shorter than `min_doc_chars` characters are dropped;
2. `max_docs` keeps the documents whose selection hash is smallest (a deterministic
   "random" subset that does not depend on file order);
3. a document goes to val when `int(sha1(key)) % 1000 < val_fraction * 1000`.

The key is the relative path for stdlib and files (so renaming nothing moves nothing) and the
document text for every other source (so duplicated documents land in the same split
and never leak from train into val). The split does not depend on `seed`: seeds vary
the training order, not the data. Corner case: with at least two documents, train and
(when `val_fraction > 0`) val each keep at least one document, moved by smallest /
largest bucket, so tiny corpora still validate. Streaming applies rules 1 and 3 lazily per
document; it has no max_docs and no corner case.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa

from lab.errors import require


_BUCKETS = 1000
_HASH_BATCH = 10_000


@dataclass(frozen=True)
class Corpus:
    """Train and val documents (each a `Dataset`, or with streaming an `IterableDataset`, with a `text` column)."""

    train: datasets.Dataset | datasets.IterableDataset
    val: datasets.Dataset | datasets.IterableDataset
    fingerprint: str
    source: str


@dataclass(frozen=True)
class Selection:
    min_doc_chars: int
    max_docs: int | None
    val_fraction: float

    def as_dict(self) -> dict:
        return {"min_doc_chars": self.min_doc_chars, "max_docs": self.max_docs, "val_fraction": self.val_fraction}


def select_and_split(raw: datasets.Dataset, text_field, selection, fingerprint, source) -> Corpus:
    require_text_column(raw, text_field)
    # One pass over the texts keeps per document only its index and split bucket (and,
    # for max_docs, its selection hash), so memory stays small for big corpora.
    kept, buckets, select_keys = [], [], []
    for index, text in enumerate(iter_column(raw, text_field)):
        text = text or ""  # a null in json/parquet is an empty document
        if len(text) >= selection.min_doc_chars:
            key = content_key(text)
            kept.append(index)
            buckets.append(split_bucket(key))
            if selection.max_docs is not None:
                select_keys.append(selection_hash(key))
    if selection.max_docs is not None and len(kept) > selection.max_docs:
        order = sorted(range(len(kept)), key=lambda i: (select_keys[i], i))
        chosen = sorted(order[: selection.max_docs])  # keep file order among chosen documents
        kept, buckets = [kept[i] for i in chosen], [buckets[i] for i in chosen]
    require_nonempty(len(kept), selection)

    texts = raw.select_columns([text_field])
    if text_field != "text":
        texts = texts.rename_column(text_field, "text")
    train_idx, val_idx = _split_by_bucket(np.array(buckets, dtype=np.int64), selection.val_fraction)
    return Corpus(
        train=texts.select([kept[i] for i in train_idx]),
        val=texts.select([kept[i] for i in val_idx]),
        fingerprint=fingerprint,
        source=source,
    )


def stream_split(raw: datasets.IterableDataset, text_field, selection, fingerprint, source) -> Corpus:
    """The streaming twin of `select_and_split`: the same filter and bucket rule, applied lazily.

    Without the whole corpus there is no tiny-corpus corner case: a split may be empty.
    """
    require_text_column(raw, text_field)
    texts = raw.select_columns([text_field])
    if text_field != "text":
        texts = texts.rename_column(text_field, "text")
    kept = texts.filter(long_enough, input_columns=["text"], fn_kwargs={"min_chars": selection.min_doc_chars})
    bucket_of = {"val_fraction": selection.val_fraction}
    return Corpus(
        train=kept.filter(in_split, input_columns=["text"], fn_kwargs={**bucket_of, "val": False}),
        val=kept.filter(in_split, input_columns=["text"], fn_kwargs={**bucket_of, "val": True}),
        fingerprint=fingerprint,
        source=source,
    )


def long_enough(text: str | None, min_chars: int) -> bool:
    return len(text or "") >= min_chars


def in_split(text: str | None, val_fraction: float, val: bool) -> bool:
    return (split_bucket(content_key(text or "")) < val_fraction * _BUCKETS) == val


def content_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def require_text_column(raw: datasets.Dataset | datasets.IterableDataset, text_field: str) -> None:
    features = raw.features
    if features is None:  # a streamed json file: the first record says which columns there are
        first = next(iter(raw.take(1)), None)
        features = datasets.Features() if first is None else datasets.Features.from_arrow_schema(
            pa.Table.from_pylist([first]).schema
        )
    columns = list(features)
    require(text_field in columns, "data.text_field", f"column {text_field!r} not found; available: {', '.join(columns)}")
    feature = features[text_field]
    is_string = isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
    require(is_string, "data.text_field", f"column {text_field!r} must hold strings, found {feature}")


def iter_column(raw: datasets.Dataset, column: str) -> Iterator[str | None]:
    for batch in raw.select_columns([column]).iter(batch_size=_HASH_BATCH):
        yield from batch[column]


def split_bucket(key: str) -> int:
    """The key's bucket in [0, 1000): val when bucket < val_fraction * 1000."""
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest(), 16) % _BUCKETS


def selection_hash(key: str) -> str:
    # Salted, so that the max_docs subset is independent of the train/val buckets.
    return hashlib.sha1(("select:" + key).encode("utf-8")).hexdigest()


def split_indices(keys: list[str], val_fraction: float) -> tuple[list[int], list[int]]:
    return _split_by_bucket(np.array([split_bucket(k) for k in keys], dtype=np.int64), val_fraction)


def _split_by_bucket(buckets: np.ndarray, val_fraction: float) -> tuple[list[int], list[int]]:
    """buckets: [D], one per document → (train indices, val indices)."""
    is_val = buckets < val_fraction * _BUCKETS
    if buckets.size >= 2:
        if is_val.all():  # train needs a document: give it the highest bucket
            is_val[np.argmax(buckets)] = False
        if val_fraction > 0 and not is_val.any():  # val too: give it the lowest bucket
            is_val[np.argmin(buckets)] = True
    else:
        is_val[:] = False
    return np.flatnonzero(~is_val).tolist(), np.flatnonzero(is_val).tolist()


def require_nonempty(n_docs: int, selection: Selection) -> None:
    require(
        n_docs > 0,
        "data",
        f"corpus is empty after filtering (min_doc_chars={selection.min_doc_chars}, "
        f"max_docs={selection.max_docs}); need at least one document",
    )


def update_digest(digest, value) -> None:
    """Length-prefixed, so that concatenations of different items cannot collide."""
    data = value.encode("utf-8") if isinstance(value, str) else json.dumps(value, sort_keys=True).encode()
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)


def first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def hf_cache_folder(cache_dir, leaf: str) -> str | None:
    return None if cache_dir is None else str(Path(cache_dir) / "hf" / leaf)

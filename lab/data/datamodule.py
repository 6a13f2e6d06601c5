"""The LightningDataModule: corpus → tokenizer → tokenized docs → packed rows → batches.

Construction only validates the config (cheap, so the CLI fails before any work).
`prepare()` does the work once per process; Lightning calls it through
`prepare_data()` (rank 0 first, filling the disk caches: BPE, tokenized docs, stats) and
`setup()` (every rank, then loading from those caches).

Rows are built on the fly (`MappedRows` over the memory-mapped tokenized cache, or with
`streaming=true` `StreamingRows` over a `datasets.IterableDataset`), so memory does not
grow with the corpus. A batch is a dict with the four batch keys of docs/tensor-conventions.md, each [B, S].
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow.compute as pc
import torch
from filelock import FileLock

from lab.data.config import validate_data_config
from lab.data.loaders import RowsDataModule
from lab.data.packing import tokenize_documents, unigram_entropy_bits_from_counts
from lab.data.sources import Corpus, load_corpus
from lab.data.streaming import StreamingRows
from lab.data.token_store import MappedRows, TokenStream
from lab.data.tokenizers import TOKENIZER_KINDS, Tokenizer, build_tokenizer
from lab.errors import require

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "mtp-lab"
# Bump when tokenization or packing output changes, so stale caches are not reused.
_CACHE_FORMAT = 2
# data.num_proc=null: one tokenizing process per this many documents, at most one per core.
_DOCS_PER_PROC = 5_000
_STATS_BATCH = 1 << 22  # tokens per bincount pass


def require_both_splits(n_train: int, n_val: int, val_fraction: float) -> None:
    """Training and validation each need a document (a one-document corpus, e.g. one long line, has one split only)."""
    require(
        n_train > 0 and n_val > 0, "data.path",
        f"the corpus splits into {n_train} training and {n_val} validation document(s) (data.val_fraction={val_fraction}); "
        "each split needs at least one: give more documents (a text file holds one per line)",
    )


# The `data` fields that choose and split the corpus: passed to load_corpus under their own names.
CORPUS_FIELDS = ("path", "name", "config_name", "split", "revision", "text_field", "val_fraction", "max_docs", "min_doc_chars",
                 "streaming", "include", "exclude")


@dataclass(frozen=True)
class _Prepared:
    tokenizer: Tokenizer
    corpus_fingerprint: str
    train_rows: MappedRows | StreamingRows
    val_rows: MappedRows | StreamingRows
    corpus_stats: dict


class LMDataModule(RowsDataModule):
    """Packed language-model batches from a text corpus (batch keys: docs/tensor-conventions.md)."""

    def __init__(
        self,
        source: str = "auto",
        path: str | list[str] | None = None,
        include: list[str] | None = None,
        exclude: list[str] | None = None,
        name: str | None = None,
        config_name: str | None = None,
        split: str = "train",
        revision: str | None = None,
        text_field: str = "text",
        tokenizer: str = "byte",
        vocab_size: int | None = None,
        tokenizer_path: str | None = None,
        seq_len: int = 128,
        batch_size: int = 16,
        val_fraction: float = 0.05,
        max_docs: int | None = None,
        min_doc_chars: int = 1,
        seed: int = 0,
        num_workers: int = 0,
        cache_dir: str | None = None,
        max_val_rows: int | None = None,
        max_train_rows: int | None = None,
        shuffle: bool = True,
        num_proc: int | None = None,
        streaming: bool = False,
        shuffle_buffer: int = 10_000,
    ):
        super().__init__()
        options = {key: value for key, value in locals().items() if key not in ("self", "__class__")}
        self.config = validate_data_config(**options)
        self.save_hyperparameters(dataclasses.asdict(self.config))
        self.cache_dir = Path(os.path.expanduser(self.config.cache_dir)) if self.config.cache_dir else DEFAULT_CACHE_DIR

    # ------------------------------------------------------------------ the work

    def prepare(self) -> None:
        """Load and tokenize the corpus (once per process; disk caches across runs and ranks).

        Processes sharing a cache folder prepare one at a time: with Lightning's launcher rank 0
        prepares before the other ranks start; launchers that start every rank at once (torchrun,
        Slurm, parallel sweep jobs) let the first one tokenize and the others read its cache.
        """
        if self._prepared is not None:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.cache_dir / "prepare.lock")):
            self._prepare()

    def _prepare(self) -> None:
        config = self.config
        corpus = load_corpus(config.source, cache_dir=self.cache_dir, **{field: getattr(config, field) for field in CORPUS_FIELDS})
        if not config.streaming:
            require_both_splits(len(corpus.train), len(corpus.val), config.val_fraction)
        tokenizer = build_tokenizer(
            config.tokenizer, config.vocab_size, _iter_texts(corpus.train), self.cache_dir, corpus.fingerprint, config.tokenizer_path
        )
        if config.streaming:
            self._prepared = self._prepare_streaming(corpus, tokenizer)
            return
        train_docs = self._tokenize(corpus, "train", tokenizer)
        val_docs = self._tokenize(corpus, "val", tokenizer)
        train_rows = MappedRows(TokenStream(train_docs), config.seq_len, tokenizer.pad_id).head(config.max_train_rows)
        val_rows = MappedRows(TokenStream(val_docs), config.seq_len, tokenizer.pad_id).head(config.max_val_rows)
        require(
            len(train_rows) >= config.batch_size,
            "data.batch_size",
            f"the training split packs into {len(train_rows)} rows of seq_len {config.seq_len}, fewer than "
            f"batch_size {config.batch_size} (no full batch); lower batch_size or seq_len, or add documents",
        )
        stats = _cached(self._cache_name(corpus, STATS_KEY, tokenizer), lambda: _corpus_stats(train_rows, val_rows, tokenizer))
        self._prepared = _Prepared(tokenizer, corpus.fingerprint, train_rows, val_rows, stats)

    def _prepare_streaming(self, corpus: Corpus, tokenizer: Tokenizer) -> _Prepared:
        config = self.config
        rows = dict(tokenizer=tokenizer, seq_len=config.seq_len, batch_size=config.batch_size)
        train_rows = StreamingRows(
            corpus.train, **rows, train=True, seed=config.seed, shuffle=config.shuffle, shuffle_buffer=config.shuffle_buffer
        )
        val_rows = StreamingRows(corpus.val, **rows, train=False, max_rows=config.max_val_rows)
        # Counting would mean reading the whole stream; only what is known without it is recorded.
        stats = {"streaming": True}
        return _Prepared(tokenizer, corpus.fingerprint, train_rows, val_rows, stats)

    def _cache_name(self, corpus: Corpus, split: str, tokenizer: Tokenizer) -> Path:
        key = json.dumps([_CACHE_FORMAT, corpus.fingerprint, split, tokenizer.identity], sort_keys=True)
        return self.cache_dir / "tokenized" / hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]

    def _tokenize(self, corpus: Corpus, split: str, tokenizer: Tokenizer) -> datasets.Dataset:
        docs = corpus.train if split == "train" else corpus.val
        num_proc = self.config.num_proc or max(1, min(os.cpu_count() or 1, len(docs) // _DOCS_PER_PROC))
        return tokenize_documents(
            docs, tokenizer, cache_file=self._cache_name(corpus, split, tokenizer).with_suffix(".arrow"), num_proc=num_proc
        )

    # ---------------------------------------------------- results of prepare()

    @property
    def vocab_size(self) -> int:
        """Known from the config alone, so a model can be built before setup()."""
        fixed = TOKENIZER_KINDS[self.config.tokenizer].vocab_before_setup(self.config.vocab_size)
        if fixed is None and self._prepared is not None:
            return self.tokenizer.vocab_size  # a pretrained model's tokenizer: known once read
        return fixed

    @property
    def token_byte_lengths(self) -> torch.Tensor:
        """[vocab_size] long: UTF-8 bytes per token id (0 for specials)."""
        return torch.from_numpy(self.tokenizer.token_byte_lengths())

    @property
    def target_byte_lengths(self) -> torch.Tensor | None:
        """[vocab_size] long: the bytes a predicted token stands for in `val/bpb` (see horizon_metrics).

        UTF-8 bytes per id, and 1 for EOS: a document's end is predicted (its loss is in
        `val/loss`) and counts as one terminator byte, so the numerator and the denominator
        of bits per byte cover the same predictions.
        """
        lengths = self.tokenizer.token_byte_lengths()
        if lengths is None:  # a tokenizer that cannot say: `val/bits_per_token` only
            return None
        lengths = torch.from_numpy(lengths).clone()
        lengths[self.tokenizer.eos_id] = 1
        return lengths

    @property
    def tokenizer(self) -> Tokenizer:
        return self._require_prepared().tokenizer

    @property
    def tokenizer_identity(self) -> dict:
        return self._require_prepared().tokenizer.identity

    @property
    def corpus_fingerprint(self) -> str:
        return self._require_prepared().corpus_fingerprint


def _iter_texts(docs: datasets.Dataset | datasets.IterableDataset) -> Iterator[str]:
    for batch in docs.iter(batch_size=1000):
        yield from batch["text"]


STATS_KEY = "stats-v3"  # v3 added val_unigram_cross_entropy_nats (v2 top_token_share): an older stats file is recomputed


def _cached(name: Path, compute) -> dict:
    """A small JSON result stored next to the tokenized cache (written atomically: ranks may race)."""
    path = name.with_suffix(".json")
    if path.is_file():
        return json.loads(path.read_text())
    value = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(value, handle)
    os.replace(tmp, path)
    return value


def _corpus_stats(train_rows: MappedRows, val_rows: MappedRows, tokenizer: Tokenizer) -> dict:
    """n_docs/n_bytes/n_tokens/n_rows per split and the unigram entropy, in bounded memory."""
    train, val = train_rows.stream, val_rows.stream
    counts, val_counts = _token_counts(train, tokenizer.vocab_size), _token_counts(val, tokenizer.vocab_size)
    n_bytes_train = _column_sum(train.tokenized, "n_bytes")
    return {
        "n_docs_train": train.n_docs,
        "n_docs_val": val.n_docs,
        "n_bytes_train": n_bytes_train,
        "n_bytes_val": _column_sum(val.tokenized, "n_bytes"),
        "n_tokens_train": train.n_tokens,
        "n_tokens_val": val.n_tokens,
        "n_rows_train": len(train_rows),
        "n_rows_val": len(val_rows),
        **_unigram_stats(counts, n_bytes_train),
        "val_unigram_cross_entropy_nats": _unigram_cross_entropy(val_counts, counts),
    }


def _token_counts(stream, vocab_size: int) -> np.ndarray:
    counts = np.zeros(vocab_size, dtype=np.int64)
    for view in stream.chunks()[0]:
        for lo in range(0, view.size, _STATS_BATCH):
            counts += np.bincount(view[lo : lo + _STATS_BATCH], minlength=vocab_size)
    return counts


def _unigram_cross_entropy(val_counts: np.ndarray, train_counts: np.ndarray) -> float:
    """Nats per validation token under the training tokens' unigram, add-one smoothed (a token validation holds and
    training does not costs log(N + V), not infinity): what a model that learned only token frequencies scores on
    validation, the floor the report's unigram warning compares validation loss with."""
    n_val = int(val_counts.sum())
    if not n_val:
        return float("nan")
    log_p = np.log((train_counts + 1) / (train_counts.sum() + train_counts.size))  # [V]
    return float(-(val_counts * log_p).sum() / n_val)


def _column_sum(docs: datasets.Dataset, column: str) -> int:
    # On the Arrow column itself: formatting batches would also convert (and the allocator keep) every `ids` list.
    total = pc.sum(docs.data.column(column)).as_py()
    return int(total or 0)


def _unigram_stats(counts: np.ndarray, n_bytes: int) -> dict:
    """Unigram entropy of the training tokens (EOS included): a floor a model must beat.

    Bits per byte spreads the stream's total unigram information over its UTF-8 bytes.
    Nats per token is the unit of the cross-entropy loss.
    """
    bits_per_token = unigram_entropy_bits_from_counts(counts)
    n_tokens = int(counts.sum())
    return {
        "top_token_share": float(counts.max() / n_tokens) if n_tokens else float("nan"),  # the most frequent token's share
        "unigram_bits_per_token": bits_per_token,
        "unigram_nats_per_token": bits_per_token * math.log(2),
        "unigram_bits_per_byte": bits_per_token * n_tokens / n_bytes if n_bytes else float("nan"),
    }

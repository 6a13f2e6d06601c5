"""The LightningDataModule: corpus → tokenizer → tokenized docs → packed rows → batches.

Construction only validates the config (cheap, so the CLI fails before any work).
`prepare()` does the work once per process; Lightning calls it through
`prepare_data()` (rank 0 first, filling the disk caches: BPE and tokenized docs) and
`setup()` (every rank, then loading from those caches).

A batch is a dict with the four DESIGN.md §2 keys, each [B, S].
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from lab.data.packing import (
    PackedRows,
    check_seq_len,
    pack_stream,
    token_stream,
    tokenize_documents,
    unigram_entropy_bits,
)
from lab.data.sampler import ResumableSampler
from lab.data.sources import LOCAL_SOURCES, SOURCES, Corpus, load_corpus, resolve_local_files
from lab.data.tokenizers import ByteTokenizer, Tokenizer, build_tokenizer, check_tokenizer_config
from lab.errors import require

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "mtp-lab"
# Bump when tokenization or packing output changes, so stale caches are not reused.
_CACHE_FORMAT = 1


@dataclass(frozen=True)
class DataConfig:
    """The `data` config group; the defaults match LMDataModule's."""

    source: str = "stdlib"
    path: str | list[str] | None = None
    name: str | None = None
    text_field: str = "text"
    tokenizer: str = "byte"
    vocab_size: int | None = None
    seq_len: int = 128
    batch_size: int = 16
    val_fraction: float = 0.05
    max_docs: int | None = None
    min_doc_chars: int = 1
    seed: int = 0
    num_workers: int = 0
    cache_dir: str | None = None
    max_val_rows: int | None = None


def validate_data_config(**options) -> DataConfig:
    """Check a `data` config without loading anything; returns it with `path` as plain strings."""
    allowed = [f.name for f in dataclasses.fields(DataConfig)]
    unknown = sorted(set(options) - set(allowed))
    require(not unknown, "data", f"unknown option(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    config = DataConfig(**options)

    require(config.source in SOURCES, "data.source", f"unknown {config.source!r}; allowed: {', '.join(SOURCES)}")
    if config.source in LOCAL_SOURCES:
        files = [str(f) for f in resolve_local_files(config.path)]
        config = dataclasses.replace(config, path=files[0] if isinstance(config.path, (str, os.PathLike)) else files)
    if config.source == "hub":
        require(isinstance(config.name, str) and config.name != "", "data.name", "the hub source needs a dataset name")
    require(
        isinstance(config.text_field, str) and config.text_field != "",
        "data.text_field",
        f"must be a column name, got {config.text_field!r}",
    )
    check_tokenizer_config(config.tokenizer, config.vocab_size)
    check_seq_len(config.seq_len)
    _require_int(config.batch_size, "data.batch_size", minimum=1)
    require(
        isinstance(config.val_fraction, (int, float))
        and not isinstance(config.val_fraction, bool)
        and 0 <= config.val_fraction < 1,
        "data.val_fraction",
        f"must be a number in [0, 1), got {config.val_fraction!r}",
    )
    _require_int(config.max_docs, "data.max_docs", minimum=0, optional=True)
    _require_int(config.min_doc_chars, "data.min_doc_chars", minimum=0)
    _require_int(config.seed, "data.seed", minimum=None)
    _require_int(config.num_workers, "data.num_workers", minimum=0)
    _require_int(config.max_val_rows, "data.max_val_rows", minimum=0, optional=True)
    require(
        config.cache_dir is None or isinstance(config.cache_dir, (str, os.PathLike)),
        "data.cache_dir",
        f"must be a folder path or null, got {config.cache_dir!r}",
    )
    return config


def _require_int(value, field: str, *, minimum: int | None, optional: bool = False) -> None:
    if optional and value is None:
        return
    is_int = isinstance(value, int) and not isinstance(value, bool)
    bound = "" if minimum is None else f" ≥ {minimum}"
    allowed = f"an integer{bound}" + (" or null" if optional else "")
    require(is_int and (minimum is None or value >= minimum), field, f"must be {allowed}, got {value!r}")


@dataclass(frozen=True)
class _Prepared:
    tokenizer: Tokenizer
    corpus_fingerprint: str
    train_rows: PackedRows
    val_rows: PackedRows
    corpus_stats: dict


class LMDataModule(pl.LightningDataModule):
    """Packed language-model batches from a text corpus (see DESIGN.md §2 for the batch keys)."""

    def __init__(
        self,
        source: str = "stdlib",
        path: str | list[str] | None = None,
        name: str | None = None,
        text_field: str = "text",
        tokenizer: str = "byte",
        vocab_size: int | None = None,
        seq_len: int = 128,
        batch_size: int = 16,
        val_fraction: float = 0.05,
        max_docs: int | None = None,
        min_doc_chars: int = 1,
        seed: int = 0,
        num_workers: int = 0,
        cache_dir: str | None = None,
        max_val_rows: int | None = None,
    ):
        super().__init__()
        self.config = validate_data_config(
            source=source,
            path=path,
            name=name,
            text_field=text_field,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            seq_len=seq_len,
            batch_size=batch_size,
            val_fraction=val_fraction,
            max_docs=max_docs,
            min_doc_chars=min_doc_chars,
            seed=seed,
            num_workers=num_workers,
            cache_dir=cache_dir,
            max_val_rows=max_val_rows,
        )
        self.save_hyperparameters(dataclasses.asdict(self.config))
        self.cache_dir = Path(os.path.expanduser(self.config.cache_dir)) if self.config.cache_dir else DEFAULT_CACHE_DIR
        self._prepared: _Prepared | None = None

    # ------------------------------------------------------------ Lightning hooks

    def prepare_data(self) -> None:
        self.prepare()

    def setup(self, stage: str | None = None) -> None:
        self.prepare()

    def train_dataloader(self) -> DataLoader:
        # The order is a function of (seed, epoch); a resumed fit starts at the restored
        # step (one batch per optimizer step), so it sees the batches the interrupted run would have.
        sampler = ResumableSampler(self.train_rows, seed=self.config.seed, batch_size=self.config.batch_size)
        sampler.resume_at(self.trainer.global_step if self.trainer is not None else 0)
        return self._loader(self.train_rows, sampler=sampler, generator=self._worker_seeds(), drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_rows, sampler=None, generator=self._worker_seeds(), drop_last=False)

    def _worker_seeds(self) -> torch.Generator:
        # A loader draws its worker seed from this generator, never from the global RNG, so a
        # resumed run (Lightning skips the validation due at its checkpoint) keeps the RNG streams aligned.
        return torch.Generator().manual_seed(self.config.seed)

    def _loader(self, rows: PackedRows, *, sampler, generator, drop_last) -> DataLoader:
        workers = self.config.num_workers
        return DataLoader(
            rows,
            batch_size=self.config.batch_size,
            sampler=sampler,  # None: sequential (validation)
            generator=generator,
            drop_last=drop_last,
            num_workers=workers,
            persistent_workers=workers > 0,
        )

    # ------------------------------------------------------------------ the work

    def prepare(self) -> None:
        """Load, tokenize and pack the corpus (once per process; disk caches across runs)."""
        if self._prepared is not None:
            return
        config = self.config
        corpus = load_corpus(
            config.source,
            path=config.path,
            name=config.name,
            text_field=config.text_field,
            val_fraction=config.val_fraction,
            max_docs=config.max_docs,
            min_doc_chars=config.min_doc_chars,
            cache_dir=self.cache_dir,
        )
        tokenizer = build_tokenizer(
            config.tokenizer, config.vocab_size, _iter_texts(corpus.train), self.cache_dir, corpus.fingerprint
        )
        train_docs = self._tokenize(corpus, "train", tokenizer)
        val_docs = self._tokenize(corpus, "val", tokenizer)
        train_stream, train_lengths = token_stream(train_docs)
        val_stream, val_lengths = token_stream(val_docs)
        train_rows = pack_stream(train_stream, train_lengths, config.seq_len, tokenizer.pad_id)
        val_rows = pack_stream(val_stream, val_lengths, config.seq_len, tokenizer.pad_id).head(config.max_val_rows)
        require(
            len(train_rows) >= config.batch_size,
            "data.batch_size",
            f"the training split packs into {len(train_rows)} rows of seq_len {config.seq_len}, fewer than "
            f"batch_size {config.batch_size} (no full batch); lower batch_size or seq_len, or add documents",
        )
        stats = {
            "n_docs_train": len(train_docs),
            "n_docs_val": len(val_docs),
            "n_bytes_train": _column_sum(train_docs, "n_bytes"),
            "n_bytes_val": _column_sum(val_docs, "n_bytes"),
            "n_tokens_train": int(train_stream.size),
            "n_tokens_val": int(val_stream.size),
            "n_rows_train": len(train_rows),
            "n_rows_val": len(val_rows),
            **_unigram_stats(train_stream, _column_sum(train_docs, "n_bytes"), tokenizer.vocab_size),
        }
        self._prepared = _Prepared(tokenizer, corpus.fingerprint, train_rows, val_rows, stats)

    def _tokenize(self, corpus: Corpus, split: str, tokenizer: Tokenizer) -> datasets.Dataset:
        key = json.dumps([_CACHE_FORMAT, corpus.fingerprint, split, tokenizer.identity], sort_keys=True)
        name = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
        docs = corpus.train if split == "train" else corpus.val
        return tokenize_documents(docs, tokenizer, cache_file=self.cache_dir / "tokenized" / f"{name}.arrow")

    # ---------------------------------------------------- results of prepare()

    @property
    def vocab_size(self) -> int:
        """Known from the config alone, so a model can be built before setup()."""
        return self.config.vocab_size if self.config.tokenizer == "bpe" else ByteTokenizer.vocab_size

    @property
    def token_byte_lengths(self) -> torch.Tensor:
        """[vocab_size] long: UTF-8 bytes per token id (0 for specials), for bits-per-byte metrics."""
        return torch.from_numpy(self.tokenizer.token_byte_lengths())

    @property
    def tokenizer(self) -> Tokenizer:
        return self._require_prepared().tokenizer

    @property
    def tokenizer_identity(self) -> dict:
        return self._require_prepared().tokenizer.identity

    @property
    def corpus_fingerprint(self) -> str:
        return self._require_prepared().corpus_fingerprint

    @property
    def train_rows(self) -> PackedRows:
        return self._require_prepared().train_rows

    @property
    def val_rows(self) -> PackedRows:
        return self._require_prepared().val_rows

    @property
    def corpus_stats(self) -> dict:
        """n_docs/n_bytes/n_tokens/n_rows per split, and the unigram entropy of the training tokens."""
        return self._require_prepared().corpus_stats

    def _require_prepared(self) -> _Prepared:
        if self._prepared is None:
            raise RuntimeError("LMDataModule: call setup() (or prepare()) before reading its data")
        return self._prepared


def _iter_texts(docs: datasets.Dataset) -> Iterator[str]:
    for batch in docs.iter(batch_size=1000):
        yield from batch["text"]


def _column_sum(docs: datasets.Dataset, column: str) -> int:
    return int(sum(int(np.sum(batch[column])) for batch in docs.iter(batch_size=10_000)))


def _unigram_stats(train_stream: np.ndarray, n_bytes: int, vocab_size: int) -> dict:
    """Unigram entropy of the training tokens (EOS included): a floor a model must beat.

    Bits per byte spreads the stream's total unigram information over its UTF-8 bytes.
    Nats per token is the unit of the cross-entropy loss.
    """
    bits_per_token = unigram_entropy_bits(train_stream, vocab_size)
    return {
        "unigram_bits_per_token": bits_per_token,
        "unigram_nats_per_token": bits_per_token * math.log(2),
        "unigram_bits_per_byte": bits_per_token * train_stream.size / n_bytes if n_bytes else float("nan"),
    }

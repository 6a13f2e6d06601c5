"""The `data` group of a text corpus: its fields, defaults and checks (`DataConfig`).

Light to import (the checks' modules are imported when a config is built), so the config schemas
Hydra composes with (lab/config/hydra_schemas.py) can read it without loading datasets or Lightning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from lab.errors import require, require_bool, require_int, require_number
from lab.schema import typed


@dataclass(frozen=True)
class DataConfig:
    """The `data` config group; the defaults match LMDataModule's."""

    source: str = "auto"  # auto: stdlib without data.path, else the files' format (lab/data/sources.py)
    path: str | list[str] | None = None
    include: list[str] | None = None  # data.source=files: keep paths (relative to the folder) matching one of these globs
    exclude: list[str] | None = None  # ... and drop those matching one of these
    name: str | None = None
    config_name: str | None = None
    split: str = "train"
    revision: str | None = None
    text_field: str = "text"
    tokenizer: str = "byte"
    vocab_size: int | None = None
    tokenizer_path: str | None = None  # data.tokenizer=hf: the tokenizer's local folder (model=hf sets both)
    seq_len: int = 128
    batch_size: int = 16
    val_fraction: float = 0.05
    max_docs: int | None = None
    min_doc_chars: int = 1
    seed: int = 0
    num_workers: int = 0
    cache_dir: str | None = None
    max_val_rows: int | None = None
    max_train_rows: int | None = None  # the first N packed training rows (a data curve over one corpus and one validation set)
    shuffle: bool = True
    num_proc: int | None = None
    streaming: bool = False
    shuffle_buffer: int = 10_000

    def __post_init__(self) -> None:
        """Checked at construction, without touching the data; `source: auto` becomes the local format the file
        extensions name (text, json, jsonl, parquet)."""
        from lab.data.packing import check_seq_len  # the checks' modules read corpora: imported when a config is built
        from lab.data.local_files import resolve_local_files
        from lab.data.sources import SOURCES, check_streaming_selection
        from lab.data.tokenizers import check_tokenizer_config

        require(self.source in SOURCES, "data.source", f"unknown {self.source!r}; allowed: {', '.join(SOURCES)}")
        require(self.source not in ("stdlib", "hub") or self.path is None, "data.path",
                f"is set, but data.source={self.source} reads no local files; leave data.source at auto (or files, text, "
                f"json, jsonl, parquet) to read {self.path!r}, or drop data.path")
        for field in ("include", "exclude"):
            value = getattr(self, field)
            require(value is None or (isinstance(value, (list, tuple)) and all(isinstance(g, str) and g for g in value)),
                    f"data.{field}", f"must be a list of globs (e.g. ['*.py']) or null, got {value!r}")
        if self.source == "auto" and self.path is None:
            object.__setattr__(self, "source", "stdlib")  # the embedded corpus
        if self.source not in ("stdlib", "hub"):  # auto: the files' format
            object.__setattr__(self, "source", resolve_local_files(self.path, self.source, self.include, self.exclude).source)
        require(self.source == "files" or (self.include is None and self.exclude is None), "data.include",
                f"filters the files of data.source=files (one document per file); data.source={self.source} reads records")
        if self.source == "hub":
            require(isinstance(self.name, str) and self.name != "", "data.name", "the hub source needs a dataset name")
            require(isinstance(self.split, str) and self.split != "", "data.split", f"must be a split name, got {self.split!r}")
        else:
            for field, default in HUB_ONLY.items():
                value = getattr(self, field)
                require(value == default, f"data.{field}", f"only for data.source=hub (leave it {'null' if default is None else default}), got {value!r}")
        check_streaming_selection(self.source, self.streaming, self.max_docs)
        require(
            isinstance(self.text_field, str) and self.text_field != "",
            "data.text_field",
            f"must be a column name, got {self.text_field!r}",
        )
        check_tokenizer_config(self.tokenizer, self.vocab_size)
        check_seq_len(self.seq_len)
        require_int(self.batch_size, "data.batch_size", least=1)
        require_number(self.val_fraction, "data.val_fraction", low=0, high=1, open_high=True)
        require_int(self.max_docs, "data.max_docs", least=0, optional=True)
        require_int(self.min_doc_chars, "data.min_doc_chars", least=0)
        require_int(self.seed, "data.seed", least=None)
        require_int(self.num_workers, "data.num_workers", least=0)
        require_int(self.max_val_rows, "data.max_val_rows", least=1, optional=True)  # 0 rows: no validation metric at all
        require_int(self.max_train_rows, "data.max_train_rows", least=1, optional=True)
        require(self.max_train_rows is None or not self.streaming, "data.max_train_rows",
                "caps the packed rows of a prepared corpus; a streamed one has no row order to cut (use data.max_docs)")
        require_int(self.num_proc, "data.num_proc", least=1, optional=True)
        require_int(self.shuffle_buffer, "data.shuffle_buffer", least=1)
        for flag in ("shuffle", "streaming"):
            require_bool(getattr(self, flag), f"data.{flag}")
        require(
            self.cache_dir is None or isinstance(self.cache_dir, (str, os.PathLike)),
            "data.cache_dir",
            f"must be a folder path or null, got {self.cache_dir!r}",
        )


HUB_ONLY = {"config_name": None, "split": "train", "revision": None}


def validate_data_config(**options) -> DataConfig:
    """The typed, checked `data` config of a text corpus (DataConfig's own checks), with `source` resolved."""
    return typed(DataConfig, options, "data", owner=f"data.source={options.get('source', 'stdlib')}")


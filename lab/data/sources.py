"""Text corpora as Hugging Face `Dataset`s with one `text` column, split into train/val.

Sources: `stdlib` (the running interpreter's standard-library `.py` files, one document
per file), local `text` / `json` / `jsonl` / `parquet` files, and `hub` (a dataset name
passed straight to `datasets.load_dataset`).

Selection rules, shared by every source, so that a corpus is a pure function of its
inputs:

1. documents shorter than `min_doc_chars` characters are dropped;
2. `max_docs` keeps the documents whose selection hash is smallest (a deterministic
   "random" subset that does not depend on file order);
3. a document goes to val when `int(sha1(key)) % 1000 < val_fraction * 1000`.

The key is the relative path for stdlib (so renaming nothing moves nothing) and the
document text for every other source (so duplicated documents land in the same split
and never leak from train into val). The split does not depend on `seed`: seeds vary
the training order, not the data. Corner case: with at least two documents, train and
(when `val_fraction > 0`) val each keep at least one document, moved by smallest /
largest bucket, so tiny corpora still validate.

The corpus fingerprint is a sha256 over what the corpus contains *and* the selection
settings (they decide the train split, which the BPE cache and the tokenized cache
are keyed by).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np

from lab.errors import ConfigError, require

SOURCES = ("stdlib", "text", "json", "jsonl", "parquet", "hub")
LOCAL_SOURCES = ("text", "json", "jsonl", "parquet")
# jsonl has no builder of its own: the json builder reads JSON Lines.
_BUILDER = {"text": "text", "json": "json", "jsonl": "json", "parquet": "parquet"}
# Tests and IDE code are huge, repetitive and not representative of ordinary code.
STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})
_BUCKETS = 1000
_HASH_BATCH = 10_000


@dataclass(frozen=True)
class Corpus:
    """Train and val documents (each a `Dataset` with a `text` column) and their fingerprint."""

    train: datasets.Dataset
    val: datasets.Dataset
    fingerprint: str
    source: str


@dataclass(frozen=True)
class _Selection:
    min_doc_chars: int
    max_docs: int | None
    val_fraction: float

    def as_dict(self) -> dict:
        return {"min_doc_chars": self.min_doc_chars, "max_docs": self.max_docs, "val_fraction": self.val_fraction}


def load_corpus(
    source: str = "stdlib",
    *,
    path: str | os.PathLike | Iterable[str | os.PathLike] | None = None,
    name: str | None = None,
    text_field: str = "text",
    val_fraction: float = 0.05,
    max_docs: int | None = None,
    min_doc_chars: int = 1,
    cache_dir: str | os.PathLike | None = None,
) -> Corpus:
    """Load, filter, subset and split a corpus. Raises ConfigError on bad input or an empty corpus."""
    selection = _Selection(min_doc_chars=min_doc_chars, max_docs=max_docs, val_fraction=val_fraction)
    if source == "stdlib":
        return _load_stdlib(selection)
    if source in LOCAL_SOURCES:
        files = resolve_local_files(path)
        return _load_local(source, files, text_field, selection, cache_dir)
    if source == "hub":
        require(bool(name), "data.name", "the hub source needs a dataset name")
        return _load_hub(name, text_field, selection, cache_dir)
    raise ConfigError("data.source", f"unknown {source!r}; allowed: {', '.join(SOURCES)}")


def resolve_local_files(path) -> list[Path]:
    """`data.path` as a list of existing files (one path or a list of paths)."""
    require(path is not None, "data.path", "local sources need a file or a list of files")
    paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    require(len(paths) > 0, "data.path", "local sources need a file or a list of files, got an empty list")
    files = [Path(os.path.expanduser(str(p))) for p in paths]
    for file in files:
        require(file.is_file(), "data.path", f"no such file: {file}")
    return files


# ---------------------------------------------------------------------------- stdlib


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Standard-library `.py` files, relative to `root`, in sorted order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    found = []
    for directory, subdirs, names in os.walk(root):
        # Pruning in place keeps os.walk out of site-packages (which can be huge).
        subdirs[:] = sorted(d for d in subdirs if d not in STDLIB_SKIP_DIRS)
        found += [Path(directory, n).relative_to(root) for n in names if n.endswith(".py")]
    return sorted(found, key=lambda p: p.as_posix())


def _load_stdlib(selection: _Selection) -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    keys = [p.as_posix() for p in stdlib_files(root)]
    # Read in selection-hash order and stop at max_docs, so a capped corpus reads only what it keeps.
    chosen: dict[str, str] = {}
    for key in sorted(keys, key=_selection_hash):
        if selection.max_docs is not None and len(chosen) >= selection.max_docs:
            break
        text = _read_utf8(root / key)
        if text is not None and len(text) >= selection.min_doc_chars:
            chosen[key] = text
    keys = sorted(chosen)
    texts = [chosen[k] for k in keys]
    _require_nonempty(len(keys), selection)

    digest = hashlib.sha256()
    _update(digest, {"source": "stdlib", "python": list(sys.version_info[:3]), **selection.as_dict()})
    for key, text in zip(keys, texts):
        _update(digest, key)
        _update(digest, text)
    train_idx, val_idx = _split_indices(keys, selection.val_fraction)
    return Corpus(
        train=datasets.Dataset.from_dict({"text": [texts[i] for i in train_idx]}),
        val=datasets.Dataset.from_dict({"text": [texts[i] for i in val_idx]}),
        fingerprint=digest.hexdigest(),
        source="stdlib",
    )


def _read_utf8(file: Path) -> str | None:
    try:
        return file.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


# ---------------------------------------------------------------------- local / hub


def local_fingerprint(source: str, files: list[Path], text_field: str, selection_settings: dict) -> str:
    """sha256 over file names (not directories: a moved corpus is the same corpus) and bytes."""
    digest = hashlib.sha256()
    _update(digest, {"source": source, "text_field": text_field, **selection_settings})
    for file in files:
        _update(digest, file.name)
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _update(digest, "end-of-file")
    return digest.hexdigest()


def _load_local(source, files, text_field, selection, cache_dir) -> Corpus:
    fingerprint = local_fingerprint(source, files, text_field, selection.as_dict())
    # A cache folder per content fingerprint: the HF cache keys local files by path and
    # mtime, which can miss a rewrite within the same timestamp.
    hf_cache = _hf_cache(cache_dir, f"local-{fingerprint[:16]}")
    try:
        raw = datasets.load_dataset(
            _BUILDER[source], data_files=[str(f) for f in files], split="train", cache_dir=hf_cache
        )
    except Exception as error:  # the builders raise many types; the CLI needs one line
        raise ConfigError("data.path", f"cannot read as {source}: {type(error).__name__}: {error}") from error
    return _select_and_split(raw, text_field, selection, fingerprint, source)


def _load_hub(name, text_field, selection, cache_dir) -> Corpus:
    digest = hashlib.sha256()
    _update(digest, {"source": "hub", "name": name, "text_field": text_field, **selection.as_dict()})
    raw = datasets.load_dataset(name, split="train", cache_dir=_hf_cache(cache_dir, "hub"))
    return _select_and_split(raw, text_field, selection, digest.hexdigest(), "hub")


def _hf_cache(cache_dir, leaf: str) -> str | None:
    return None if cache_dir is None else str(Path(cache_dir) / "hf" / leaf)


def _select_and_split(raw: datasets.Dataset, text_field, selection, fingerprint, source) -> Corpus:
    _require_text_column(raw, text_field)
    keys, kept = [], []
    for index, text in enumerate(_iter_column(raw, text_field)):
        text = text or ""  # a null in json/parquet is an empty document
        if len(text) >= selection.min_doc_chars:
            kept.append(index)
            keys.append(hashlib.sha1(text.encode("utf-8")).hexdigest())
    if selection.max_docs is not None and len(kept) > selection.max_docs:
        order = sorted(range(len(kept)), key=lambda i: (_selection_hash(keys[i]), i))
        chosen = sorted(order[: selection.max_docs])  # keep file order among chosen documents
        kept, keys = [kept[i] for i in chosen], [keys[i] for i in chosen]
    _require_nonempty(len(kept), selection)

    texts = raw.select_columns([text_field])
    if text_field != "text":
        texts = texts.rename_column(text_field, "text")
    train_idx, val_idx = _split_indices(keys, selection.val_fraction)
    return Corpus(
        train=texts.select([kept[i] for i in train_idx]),
        val=texts.select([kept[i] for i in val_idx]),
        fingerprint=fingerprint,
        source=source,
    )


def _require_text_column(raw: datasets.Dataset, text_field: str) -> None:
    require(
        text_field in raw.column_names,
        "data.text_field",
        f"column {text_field!r} not found; available: {', '.join(raw.column_names)}",
    )
    feature = raw.features[text_field]
    is_string = isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")
    require(is_string, "data.text_field", f"column {text_field!r} must hold strings, found {feature}")


def _iter_column(raw: datasets.Dataset, column: str) -> Iterator[str | None]:
    for batch in raw.select_columns([column]).iter(batch_size=_HASH_BATCH):
        yield from batch[column]


# ------------------------------------------------------------------- shared rules


def split_bucket(key: str) -> int:
    """The key's bucket in [0, 1000): val when bucket < val_fraction * 1000."""
    return int(hashlib.sha1(key.encode("utf-8")).hexdigest(), 16) % _BUCKETS


def _selection_hash(key: str) -> str:
    # Salted, so that the max_docs subset is independent of the train/val buckets.
    return hashlib.sha1(("select:" + key).encode("utf-8")).hexdigest()


def _split_indices(keys: list[str], val_fraction: float) -> tuple[list[int], list[int]]:
    buckets = np.array([split_bucket(k) for k in keys], dtype=np.int64)
    is_val = buckets < val_fraction * _BUCKETS
    if len(keys) >= 2:
        if is_val.all():  # train needs a document: give it the highest bucket
            is_val[np.argmax(buckets)] = False
        if val_fraction > 0 and not is_val.any():  # val too: give it the lowest bucket
            is_val[np.argmin(buckets)] = True
    else:
        is_val[:] = False
    return np.flatnonzero(~is_val).tolist(), np.flatnonzero(is_val).tolist()


def _require_nonempty(n_docs: int, selection: _Selection) -> None:
    require(
        n_docs > 0,
        "data",
        f"corpus is empty after filtering (min_doc_chars={selection.min_doc_chars}, "
        f"max_docs={selection.max_docs}); need at least one document",
    )


def _update(digest, value) -> None:
    """Length-prefixed, so that concatenations of different items cannot collide."""
    data = value.encode("utf-8") if isinstance(value, str) else json.dumps(value, sort_keys=True).encode()
    digest.update(len(data).to_bytes(8, "little"))
    digest.update(data)

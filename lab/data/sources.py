"""Text corpora as Hugging Face `Dataset`s with one `text` column, split into train/val.

Sources, and what each makes a document of:

- `stdlib`: the running interpreter's standard-library `.py` files, one document per file;
- `files`: the files of `data.path` (a folder, a glob or a list), one document per file, any
  extension; UTF-8 text only (a file with a NUL byte or invalid UTF-8 is skipped and counted);
  `data.include` / `data.exclude` filter the paths relative to the folder by glob;
- `text`: one document per line; `json` / `jsonl` / `parquet`: one per record's `text_field`;
- `hub`: a dataset name, subset, split and revision passed to `datasets.load_dataset`.

`auto` (the default) is `stdlib` without a `data.path`; with one it is the structured format the
extensions name when every file has one (.json, .jsonl, .parquet; .txt given file by file: text),
else `files`. So `data.path=<folder of .py>` reads one document per file.

Selection rules, shared by every source, so that a corpus is a pure function of its
inputs:

1. documents shorter than `min_doc_chars` characters are dropped;
2. `max_docs` keeps the documents whose selection hash is smallest (a deterministic
   "random" subset that does not depend on file order);
3. a document goes to val when `int(sha1(key)) % 1000 < val_fraction * 1000`.

The key is the relative path for stdlib and files (so renaming nothing moves nothing) and the
document text for every other source (so duplicated documents land in the same split
and never leak from train into val). The split does not depend on `seed`: seeds vary
the training order, not the data. Corner case: with at least two documents, train and
(when `val_fraction > 0`) val each keep at least one document, moved by smallest /
largest bucket, so tiny corpora still validate. Streaming (`streaming=True`) applies
rules 1 and 3 lazily per document; it has no max_docs and no corner case.

The corpus fingerprint is a sha256 over what the corpus contains *and* the selection
settings (they decide the train split, which the BPE cache and the tokenized cache
are keyed by). For the Hub, where the content is not known before download, it covers
the dataset name, subset, split and revision instead.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import glob
import hashlib
import importlib.util
import json
import os
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa

from lab.data.diagnose import diagnose
from lab.errors import ConfigError, require

SOURCES = ("auto", "stdlib", "files", "text", "json", "jsonl", "parquet", "hub")
LOCAL_SOURCES = ("files", "text", "json", "jsonl", "parquet")
STRUCTURED = ("json", "jsonl", "parquet")  # formats `auto` takes from the extensions (one document per record)
# jsonl has no builder of its own: the json builder reads JSON Lines.
_BUILDER = {"text": "text", "json": "json", "jsonl": "json", "parquet": "parquet"}
# `data.source=auto` reads the format from the file name; `datasets` (through fsspec)
# decompresses these suffixes itself. Parquet compresses internally, so it takes none.
FORMAT_OF_EXTENSION = {".txt": "text", ".json": "json", ".jsonl": "jsonl", ".parquet": "parquet"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
_COMPRESSIBLE = ("text", "json", "jsonl")
_GLOB_CHARS = frozenset("*?[")
# Tests and IDE code are huge, repetitive and not representative of ordinary code.
STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})
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
class HubDataset:
    """What `datasets.load_dataset` needs to find one split of a Hub dataset."""

    name: str
    config_name: str | None = None  # the dataset's subset ("wikitext-2-raw-v1")
    split: str = "train"  # any split expression `datasets` accepts ("train[:10%]")
    revision: str | None = None  # a branch, tag or commit of the dataset repository

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class LocalFiles:
    """Resolved `data.path`: the format to read and the files, in a deterministic order."""

    source: str
    files: tuple[Path, ...]
    root: Path | None = None  # the folder names are relative to (default: the files' common folder)

    def names(self) -> list[str]:
        """Paths relative to `root`: what the fingerprint hashes (a moved corpus is the same) and, for data.source=files,
        the key of the train/validation split (data.include / exclude do not move a file's key)."""
        root = self.root or Path(os.path.commonpath([f.parent for f in self.files]))
        return [f.relative_to(root).as_posix() for f in self.files]


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
    config_name: str | None = None,
    split: str = "train",
    revision: str | None = None,
    text_field: str = "text",
    val_fraction: float = 0.05,
    max_docs: int | None = None,
    min_doc_chars: int = 1,
    cache_dir: str | os.PathLike | None = None,
    streaming: bool = False,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
) -> Corpus:
    """Load, filter, subset and split a corpus. Raises ConfigError on bad input or an empty corpus.

    With `streaming`, train and val are `IterableDataset`s read lazily in file order
    (`max_docs` needs the whole corpus and is refused, except for the in-memory stdlib corpus).
    """
    selection = _Selection(min_doc_chars=min_doc_chars, max_docs=max_docs, val_fraction=val_fraction)
    check_streaming_selection(source, streaming, max_docs)
    if source == "auto" and path is None:
        source = "stdlib"
    if source == "stdlib":
        corpus = _load_stdlib(selection)
        if not streaming:
            return corpus
        return dataclasses.replace(corpus, train=corpus.train.to_iterable_dataset(), val=corpus.val.to_iterable_dataset())
    if source == "hub":
        require(bool(name), "data.name", "the hub source needs a dataset name")
        hub = HubDataset(name=name, config_name=config_name, split=split, revision=revision)
        return _load_hub(hub, text_field, selection, cache_dir, streaming)
    local = resolve_local_files(path, source, include, exclude)
    if local.source == "files":
        return _load_files(local, selection, streaming)
    return _load_local(local, text_field, selection, cache_dir, streaming)


def check_streaming_selection(source: str, streaming: bool, max_docs: int | None) -> None:
    """A streamed corpus is read once in order; the max_docs subset needs all of it (stdlib is in memory anyway)."""
    require(
        not (streaming and max_docs is not None and source != "stdlib"),
        "data.max_docs",
        "must be null with data.streaming=true (choosing a subset needs the whole corpus)",
    )


def resolve_local_files(path, source: str = "auto", include: list[str] | None = None, exclude: list[str] | None = None) -> LocalFiles:
    """`data.path` (a file, folder or glob, or a list of them) as files of one format.

    `source="auto"`: a structured format (json, jsonl, parquet) when every file's extension names the same
    one, text when every entry is a .txt file named directly, else `files` (one document per file). An
    explicit local source reads every file with its builder. Hidden files in folders are skipped;
    `include` / `exclude` filter paths relative to their folder by glob (fnmatch).
    """
    require(
        source == "auto" or source in LOCAL_SOURCES,
        "data.source",
        f"unknown {source!r}; allowed: {', '.join(SOURCES)}",
    )
    require(path is not None, "data.path", "local sources need a file, folder or glob, or a list of them")
    require(isinstance(path, (str, os.PathLike)) or (isinstance(path, (list, tuple)) and all(isinstance(p, (str, os.PathLike)) for p in path)),
            "data.path", f"must be a file, folder or glob (a string) or a list of them, got {path!r}")
    entries = [path] if isinstance(path, (str, os.PathLike)) else list(path)
    require(len(entries) > 0, "data.path", "local sources need a file, folder or glob, or a list of them; got an empty list")
    files: list[Path] = []
    for entry in entries:
        files += _expand(os.path.expanduser(str(entry)))
    files = list(dict.fromkeys(files))  # a file named twice (a glob and a list) is read once
    root = Path(os.path.commonpath([f.parent for f in files])) if files else None  # before filtering: keys stay put
    files = filter_paths(files, include, exclude, root)
    for file in files:  # datasets' builders answer an empty file with "DatasetGenerationError: An error occurred ..."
        require(file.stat().st_size > 0 or source in ("auto", "files"), "data.path",
                f"{file} is empty (0 bytes); give a file with at least one document")
    if source != "auto":
        return LocalFiles(source, tuple(files), root)
    return LocalFiles(auto_format(files, entries), tuple(files), root)


def auto_format(files: list[Path], entries: list) -> str:
    """`data.source=auto` with a path: the one structured format every file names, text for .txt files named one by
    one, else `files` (a folder of code, prose or mixed extensions: one document per file)."""
    formats = {file: extension_format(file) for file in files}
    found = sorted(set(formats.values()) - {None})
    if len(found) == 1 and None not in formats.values() and found[0] in STRUCTURED:
        for file in files:
            format_of(file)  # refuses a compressed parquet
        return found[0]
    if found == ["text"] and None not in formats.values() and all(Path(os.path.expanduser(str(e))).is_file() for e in entries):
        return "text"
    return "files"


def filter_paths(files: list[Path], include: list[str] | None, exclude: list[str] | None, root: Path | None) -> list[Path]:
    """Files whose path relative to `root` (their common folder) matches an `include` glob (all when None) and no `exclude` glob."""
    if not include and not exclude:
        return files
    relative = {f: f.relative_to(root).as_posix() for f in files}
    kept = [f for f in files if (not include or any(fnmatch.fnmatch(relative[f], g) or fnmatch.fnmatch(f.name, g) for g in include))
            and not any(fnmatch.fnmatch(relative[f], g) or fnmatch.fnmatch(f.name, g) for g in exclude or ())]
    require(bool(kept), "data.include", f"no file of data.path is left by include={include} exclude={exclude} ({len(files)} files before)")
    return kept


def extension_format(file: Path) -> str | None:
    """The format a file's extension names (compression suffixes aside), or None."""
    suffixes = [s.lower() for s in file.suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes.pop()
    return FORMAT_OF_EXTENSION.get(suffixes[-1]) if suffixes else None


def _expand(entry: str) -> list[Path]:
    if _GLOB_CHARS & set(entry):
        matches = sorted(Path(m) for m in glob.glob(entry, recursive=True) if Path(m).is_file())
        require(bool(matches), "data.path", f"no file matches {entry}")
        return matches
    path = Path(entry)
    if path.is_dir():
        found = sorted(
            f for f in path.rglob("*") if f.is_file() and not any(p.startswith(".") for p in f.relative_to(path).parts)
        )
        require(bool(found), "data.path", f"folder {path} holds no files")
        return found
    require(path.is_file(), "data.path", f"no such file: {path}")
    return [path]


def format_of(file: Path) -> str:
    """The local source a file's extension names (`.jsonl.gz` → jsonl); ConfigError when none does."""
    suffixes = [s.lower() for s in file.suffixes]
    compression = suffixes.pop() if suffixes and suffixes[-1] in COMPRESSIONS else None
    kind = FORMAT_OF_EXTENSION.get(suffixes[-1]) if suffixes else None
    known = ", ".join(FORMAT_OF_EXTENSION)
    require(
        kind is not None,
        "data.path",
        f"cannot infer the format of {file.name} from its extension; known: {known} "
        f"(text/json/jsonl also compressed {', '.join(COMPRESSIONS)}), or set data.source",
    )
    if compression is not None:
        require(kind in _COMPRESSIBLE, "data.path", f"{file.name}: parquet compresses internally; give the .parquet file")
        if compression == ".zst":
            require(
                importlib.util.find_spec("zstandard") is not None,
                "data.path",
                f"{file.name}: reading .zst needs the zstandard package (pip install 'mtp-lab[zst]')",
            )
    return kind


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


# ---------------------------------------------------------------------------- files


def read_text_file(file: Path) -> str | None:
    """A file's text when it is UTF-8 text (no NUL byte, valid UTF-8), else None (binary or another encoding)."""
    data = file.read_bytes()
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _load_files(local: LocalFiles, selection: _Selection, streaming: bool) -> Corpus:
    """One document per file, keyed (selection, split) by its path relative to the files' common folder, like stdlib."""
    texts, skipped = {}, []
    for name, file in zip(local.names(), local.files):
        text = read_text_file(file)
        if text is None:
            skipped.append(name)
        elif len(text) >= selection.min_doc_chars:
            texts[name] = text
    if not texts and skipped:
        raise ConfigError("data.path", f"none of its {len(skipped)} files is UTF-8 text (binary or another encoding, "
                                       f"e.g. {skipped[0]}); nothing to train on")
    chosen = sorted(texts, key=_selection_hash)[: selection.max_docs] if selection.max_docs is not None else list(texts)
    keys = sorted(chosen)
    _require_nonempty(len(keys), selection)
    if skipped:
        print(f"data.path: {len(keys)} documents from {len(local.files)} files; skipped {len(skipped)} that are not UTF-8 text "
              f"(binary or another encoding, e.g. {skipped[0]})", file=sys.stderr, flush=True)
    train_idx, val_idx = _split_indices(keys, selection.val_fraction)
    train = datasets.Dataset.from_dict({"text": [texts[keys[i]] for i in train_idx]})
    val = datasets.Dataset.from_dict({"text": [texts[keys[i]] for i in val_idx]})
    if streaming:
        train, val = train.to_iterable_dataset(), val.to_iterable_dataset()
    return Corpus(train=train, val=val, fingerprint=local_fingerprint(local, "files", selection.as_dict()), source="files")


# ---------------------------------------------------------------------- local / hub


def local_fingerprint(local: LocalFiles, text_field: str, selection_settings: dict) -> str:
    """sha256 over file names (relative to their common folder: a moved corpus is the same corpus) and bytes."""
    digest = hashlib.sha256()
    _update(digest, {"source": local.source, "text_field": text_field, **selection_settings})
    for name, file in zip(local.names(), local.files):
        _update(digest, name)
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _update(digest, "end-of-file")
    return digest.hexdigest()


def _load_local(local: LocalFiles, text_field, selection, cache_dir, streaming) -> Corpus:
    fingerprint = local_fingerprint(local, text_field, selection.as_dict())
    # A cache folder per content fingerprint: the HF cache keys local files by path and
    # mtime, which can miss a rewrite within the same timestamp.
    hf_cache = _hf_cache(cache_dir, f"local-{fingerprint[:16]}")
    try:
        raw = datasets.load_dataset(
            _BUILDER[local.source],
            data_files=[str(f) for f in local.files],
            split="train",
            cache_dir=hf_cache,
            streaming=streaming,
        )
        if streaming:
            _require_text_column(raw, text_field)  # reads the first record: a broken file fails here
    except ConfigError:
        raise
    except Exception as error:  # the builders raise many types; the CLI needs one line
        fault = diagnose(local.files, local.source) if local.source != "parquet" else None
        raise ConfigError("data.path", fault or f"cannot read as {local.source}: {type(error).__name__}: {_first_line(error)}") from error
    split = _stream_split if streaming else _select_and_split
    return split(raw, text_field, selection, fingerprint, local.source)


def hub_fingerprint(hub: HubDataset, text_field: str, selection_settings: dict) -> str:
    """sha256 over what names the data (dataset, subset, split, revision) and the selection settings.

    The Hub serves no content hash before download; pin `revision` to a commit for a
    fingerprint that cannot drift when the dataset's main branch changes.
    """
    digest = hashlib.sha256()
    _update(digest, {"source": "hub", **hub.as_dict(), "text_field": text_field, **selection_settings})
    return digest.hexdigest()


def _load_hub(hub: HubDataset, text_field, selection, cache_dir, streaming) -> Corpus:
    fingerprint = hub_fingerprint(hub, text_field, selection.as_dict())
    try:
        raw = datasets.load_dataset(
            hub.name,
            hub.config_name,
            split=hub.split,
            revision=hub.revision,
            cache_dir=_hf_cache(cache_dir, "hub"),
            streaming=streaming,
        )
    except ConnectionError as error:  # datasets' own "Couldn't reach '…' on the Hub (…)"
        raise ConfigError(
            "data.name",
            f"cannot reach Hub dataset {hub.name!r} ({_first_line(error)}); to train offline, download it once and "
            f"run with HF_DATASETS_OFFLINE=1 (it is read from the datasets cache), or save it to files and use "
            f"data=text data.path=<files>",
        ) from error
    except Exception as error:  # not found, gated, bad subset or split: the library's first line says which
        field = _hub_field(error)
        raise ConfigError(field, f"cannot load Hub dataset {hub.name!r}: {type(error).__name__}: {_first_line(error)}") from error
    split = _stream_split if streaming else _select_and_split
    return split(raw, text_field, selection, fingerprint, "hub")


def _hub_field(error: Exception) -> str:
    """Which setting a `load_dataset` error is about, read from its message."""
    message = str(error).lower()
    if "config" in message:
        return "data.config_name"
    if "split" in message:
        return "data.split"
    if "revision" in message:
        return "data.revision"
    return "data.name"


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def _hf_cache(cache_dir, leaf: str) -> str | None:
    return None if cache_dir is None else str(Path(cache_dir) / "hf" / leaf)


def _select_and_split(raw: datasets.Dataset, text_field, selection, fingerprint, source) -> Corpus:
    _require_text_column(raw, text_field)
    # One pass over the texts keeps per document only its index and split bucket (and,
    # for max_docs, its selection hash), so memory stays small for big corpora.
    kept, buckets, select_keys = [], [], []
    for index, text in enumerate(_iter_column(raw, text_field)):
        text = text or ""  # a null in json/parquet is an empty document
        if len(text) >= selection.min_doc_chars:
            key = _content_key(text)
            kept.append(index)
            buckets.append(split_bucket(key))
            if selection.max_docs is not None:
                select_keys.append(_selection_hash(key))
    if selection.max_docs is not None and len(kept) > selection.max_docs:
        order = sorted(range(len(kept)), key=lambda i: (select_keys[i], i))
        chosen = sorted(order[: selection.max_docs])  # keep file order among chosen documents
        kept, buckets = [kept[i] for i in chosen], [buckets[i] for i in chosen]
    _require_nonempty(len(kept), selection)

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


def _stream_split(raw: datasets.IterableDataset, text_field, selection, fingerprint, source) -> Corpus:
    """The streaming twin of `_select_and_split`: the same filter and bucket rule, applied lazily.

    Without the whole corpus there is no tiny-corpus corner case: a split may be empty.
    """
    _require_text_column(raw, text_field)
    texts = raw.select_columns([text_field])
    if text_field != "text":
        texts = texts.rename_column(text_field, "text")
    kept = texts.filter(_long_enough, input_columns=["text"], fn_kwargs={"min_chars": selection.min_doc_chars})
    bucket_of = {"val_fraction": selection.val_fraction}
    return Corpus(
        train=kept.filter(_in_split, input_columns=["text"], fn_kwargs={**bucket_of, "val": False}),
        val=kept.filter(_in_split, input_columns=["text"], fn_kwargs={**bucket_of, "val": True}),
        fingerprint=fingerprint,
        source=source,
    )


def _long_enough(text: str | None, min_chars: int) -> bool:
    return len(text or "") >= min_chars


def _in_split(text: str | None, val_fraction: float, val: bool) -> bool:
    return (split_bucket(_content_key(text or "")) < val_fraction * _BUCKETS) == val


def _content_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def _require_text_column(raw: datasets.Dataset | datasets.IterableDataset, text_field: str) -> None:
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

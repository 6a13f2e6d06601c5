"""Local corpus files (`data.path`): which files, in which format, read how, and their fingerprint.

- `files`: the files of `data.path` (a folder, a glob or a list), one document per file, any
  extension; UTF-8 text only (a file with a NUL byte or invalid UTF-8 is skipped and counted);
  `data.include` / `data.exclude` filter the paths relative to the folder by glob;
- `text`: one document per line; `json` / `jsonl` / `parquet`: one per record's `text_field`.

`auto` and `local` take the structured format the extensions name when every file has one (.json,
.jsonl, .parquet; .txt given file by file: text), else `files`. The fingerprint covers the files'
relative paths and bytes and the selection settings.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import datasets

from lab.data.diagnose import diagnose
from lab.errors import ConfigError, require
from lab.data.corpus_split import (
    Corpus,
    Selection,
    select_and_split,
    stream_split,
    require_text_column,
    selection_hash,
    split_indices,
    require_nonempty,
    update_digest,
    first_line,
    hf_cache_folder,
)

FORMAT_FROM_FILES = ("auto", "local")
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


def resolve_local_files(path, source: str = "auto", include: list[str] | None = None, exclude: list[str] | None = None) -> LocalFiles:
    """`data.path` (a file, folder or glob, or a list of them) as files of one format.

    `source="auto"`: a structured format (json, jsonl, parquet) when every file's extension names the same
    one, text when every entry is a .txt file named directly, else `files` (one document per file). An
    explicit local source reads every file with its builder. Hidden files in folders are skipped;
    `include` / `exclude` filter paths relative to their folder by glob (fnmatch).
    """
    require(
        source in FORMAT_FROM_FILES or source in LOCAL_SOURCES,
        "data.source",
        f"unknown {source!r}; allowed: {', '.join((*FORMAT_FROM_FILES, *LOCAL_SOURCES))}",
    )
    require(path is not None, "data.path", f"data.source={source} reads local files and none is named; give data.path=<file, folder or "
                                           "glob> (or data=stdlib for the embedded corpus)")
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
        require(file.stat().st_size > 0 or source in (*FORMAT_FROM_FILES, "files"), "data.path",
                f"{file} is empty (0 bytes); give a file with at least one document")
    if source not in FORMAT_FROM_FILES:
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


def read_utf8(file: Path) -> str | None:
    try:
        return file.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def read_text_file(file: Path) -> str | None:
    """A file's text when it is UTF-8 text (no NUL byte, valid UTF-8), else None (binary or another encoding)."""
    data = file.read_bytes()
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def load_files(local: LocalFiles, selection: Selection, streaming: bool) -> Corpus:
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
    chosen = sorted(texts, key=selection_hash)[: selection.max_docs] if selection.max_docs is not None else list(texts)
    keys = sorted(chosen)
    require_nonempty(len(keys), selection)
    if skipped:
        print(f"data.path: {len(keys)} documents from {len(local.files)} files; skipped {len(skipped)} that are not UTF-8 text "
              f"(binary or another encoding, e.g. {skipped[0]})", file=sys.stderr, flush=True)
    train_idx, val_idx = split_indices(keys, selection.val_fraction)
    train = datasets.Dataset.from_dict({"text": [texts[keys[i]] for i in train_idx]})
    val = datasets.Dataset.from_dict({"text": [texts[keys[i]] for i in val_idx]})
    if streaming:
        train, val = train.to_iterable_dataset(), val.to_iterable_dataset()
    return Corpus(train=train, val=val, fingerprint=local_fingerprint(local, "files", selection.as_dict()), source="files")


def local_fingerprint(local: LocalFiles, text_field: str, selection_settings: dict) -> str:
    """sha256 over file names (relative to their common folder: a moved corpus is the same corpus) and bytes."""
    digest = hashlib.sha256()
    update_digest(digest, {"source": local.source, "text_field": text_field, **selection_settings})
    for name, file in zip(local.names(), local.files):
        update_digest(digest, name)
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        update_digest(digest, "end-of-file")
    return digest.hexdigest()


def load_local(local: LocalFiles, text_field, selection, cache_dir, streaming) -> Corpus:
    fingerprint = local_fingerprint(local, text_field, selection.as_dict())
    # A cache folder per content fingerprint: the HF cache keys local files by path and
    # mtime, which can miss a rewrite within the same timestamp.
    hf_cache = hf_cache_folder(cache_dir, f"local-{fingerprint[:16]}")
    try:
        raw = datasets.load_dataset(
            _BUILDER[local.source],
            data_files=[str(f) for f in local.files],
            split="train",
            cache_dir=hf_cache,
            streaming=streaming,
        )
        if streaming:
            require_text_column(raw, text_field)  # reads the first record: a broken file fails here
    except ConfigError:
        raise
    except Exception as error:  # the builders raise many types; the CLI needs one line
        fault = diagnose(local.files, local.source) if local.source != "parquet" else None
        raise ConfigError("data.path", fault or f"cannot read as {local.source}: {type(error).__name__}: {first_line(error)}") from error
    split = stream_split if streaming else select_and_split
    return split(raw, text_field, selection, fingerprint, local.source)

"""Text corpora as Hugging Face `Dataset`s with one `text` column, split into train/val: the entry point.

The sources (`data.source`), each in its own module:

- `stdlib` (lab/data/stdlib_source.py): the running interpreter's standard-library `.py` files;
- `files`, `text`, `json`, `jsonl`, `parquet` (lab/data/local_files.py): the files of `data.path`;
- `hub` (lab/data/hub_source.py): a Hugging Face Hub dataset;
- `auto` (the default): `stdlib` without a `data.path`, with one the format its files' extensions name;
  `local` (`data=text`): the same, with `data.path` required.

Every source selects and splits its documents by the same rules (lab/data/corpus_split.py), so a corpus
is a pure function of its inputs, and carries a fingerprint of its content and selection settings (they
decide the train split, which the BPE cache and the tokenized cache are keyed by).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

from lab.errors import require
from lab.data.corpus_split import Corpus, Selection
from lab.data.local_files import FORMAT_FROM_FILES, LOCAL_SOURCES, load_files, load_local, resolve_local_files
from lab.data.hub_source import HubDataset, load_hub
from lab.data.stdlib_source import load_stdlib

# auto: the embedded corpus without data.path, else the files' format; local: the files' format, data.path required
# (data=text: a run that names no files must not train on the embedded corpus unnoticed).
SOURCES = (*FORMAT_FROM_FILES, "stdlib", *LOCAL_SOURCES, "hub")


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
    selection = Selection(min_doc_chars=min_doc_chars, max_docs=max_docs, val_fraction=val_fraction)
    check_streaming_selection(source, streaming, max_docs)
    if source == "auto" and path is None:
        source = "stdlib"
    if source == "stdlib":
        corpus = load_stdlib(selection)
        if not streaming:
            return corpus
        return dataclasses.replace(corpus, train=corpus.train.to_iterable_dataset(), val=corpus.val.to_iterable_dataset())
    if source == "hub":
        require(bool(name), "data.name", "the hub source needs a dataset name")
        hub = HubDataset(name=name, config_name=config_name, split=split, revision=revision)
        return load_hub(hub, text_field, selection, cache_dir, streaming)
    local = resolve_local_files(path, source, include, exclude)
    if local.source == "files":
        return load_files(local, selection, streaming)
    return load_local(local, text_field, selection, cache_dir, streaming)


def check_streaming_selection(source: str, streaming: bool, max_docs: int | None) -> None:
    """A streamed corpus is read once in order; the max_docs subset needs all of it (stdlib is in memory anyway)."""
    require(
        not (streaming and max_docs is not None and source != "stdlib"),
        "data.max_docs",
        "must be null with data.streaming=true (choosing a subset needs the whole corpus)",
    )

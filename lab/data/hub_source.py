"""A Hugging Face Hub dataset as a corpus: name, subset, split and revision passed to `datasets.load_dataset`.

Its content is not known before download, so its fingerprint covers the dataset's coordinates and the
selection settings instead of the text.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import datasets

from lab.errors import ConfigError
from lab.data.corpus_split import Corpus, select_and_split, stream_split, update_digest, first_line, hf_cache_folder


@dataclass(frozen=True)
class HubDataset:
    """What `datasets.load_dataset` needs to find one split of a Hub dataset."""

    name: str
    config_name: str | None = None  # the dataset's subset ("wikitext-2-raw-v1")
    split: str = "train"  # any split expression `datasets` accepts ("train[:10%]")
    revision: str | None = None  # a branch, tag or commit of the dataset repository

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def hub_fingerprint(hub: HubDataset, text_field: str, selection_settings: dict) -> str:
    """sha256 over what names the data (dataset, subset, split, revision) and the selection settings.

    The Hub serves no content hash before download; pin `revision` to a commit for a
    fingerprint that cannot drift when the dataset's main branch changes.
    """
    digest = hashlib.sha256()
    update_digest(digest, {"source": "hub", **hub.as_dict(), "text_field": text_field, **selection_settings})
    return digest.hexdigest()


def load_hub(hub: HubDataset, text_field, selection, cache_dir, streaming) -> Corpus:
    fingerprint = hub_fingerprint(hub, text_field, selection.as_dict())
    try:
        raw = datasets.load_dataset(
            hub.name,
            hub.config_name,
            split=hub.split,
            revision=hub.revision,
            cache_dir=hf_cache_folder(cache_dir, "hub"),
            streaming=streaming,
        )
    except ConnectionError as error:  # datasets' own "Couldn't reach '…' on the Hub (…)"
        raise ConfigError(
            "data.name",
            f"cannot reach Hub dataset {hub.name!r} ({first_line(error)}); to train offline, download it once and "
            f"run with HF_DATASETS_OFFLINE=1 (it is read from the datasets cache), or save it to files and use "
            f"data=text data.path=<files>",
        ) from error
    except Exception as error:  # not found, gated, bad subset or split: the library's first line says which
        field = _hub_field(error)
        raise ConfigError(field, f"cannot load Hub dataset {hub.name!r}: {type(error).__name__}: {first_line(error)}") from error
    split = stream_split if streaming else select_and_split
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

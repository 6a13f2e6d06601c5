"""What a release layout is: how it writes a run's weights, recognises and loads a folder, reads it as a parent."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class LoadedFolder:
    """A folder in a release layout, read for decoding."""

    model: Any  # MTPModel in eval mode
    tokenizer: Any
    proposer_refusal: str | None = None  # why it may not draft (None: it drafts with its head)


@dataclass(frozen=True)
class ParentWeights:
    """A folder in a release layout read as the parent of `init_from`."""

    state: dict  # keyed like MTPModel.state_dict()
    model: dict  # the parent's model config (vocab_size at least)
    tokenizer: dict  # its tokenizer identity ({} when unknown)
    head: str | None  # the head name that trained its head weights (None: it has none)


@dataclass(frozen=True)
class InitFromReader:
    """How `init_from=<source>` reads a folder of this layout.

    `kind` is recorded in the manifest; `prefix` (e.g. "hf:") selects the reader by the source's spelling,
    None selects it when the layout `recognizes` the folder. `weight_folders` names the folders whose safetensors
    files `read` reads: the weight check runs on them before the run folder is made (lab/release/init_from.py).
    """

    kind: str
    read: Callable[[Path, Any], ParentWeights]  # (folder, this run's model)
    identity_file: Callable[[Path], Path]  # the file whose sha256 identifies the parent
    prefix: str | None = None
    weight_folders: Callable[[Path], list[Path]] = lambda folder: [folder]


@dataclass(frozen=True)
class ReleaseLayout:
    """A format outside the harness that holds a head's weights (`lab-export --format <name>`), for the head whose
    spec names it in `release_layouts`."""

    name: str
    help: str  # one line for `lab-export --help`
    export: Callable[[dict, Path, Any], str]  # (checkpoint, out, model) -> what to print
    recognizes: Callable[[Path], bool] | None = None  # a folder in this layout (lab-generate, init_from)
    load: Callable[[Path], LoadedFolder] | None = None  # lab-generate DIR
    init_from: InitFromReader | None = None
    check: Callable[[str], int] | None = None  # `lab-export --check DIR`: print a verdict, 0 when it passes

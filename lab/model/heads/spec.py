"""`HeadSpec`: everything the harness knows of one head architecture, declared in its folder.

Each architecture is a package `lab/model/heads/<name>/` whose `__init__` exposes `SPEC`. Every
consumer reads the spec (through the registry in lab/model/heads/__init__.py), never the name:
training builds `module` with a `config` instance, decoding builds `drafter`, `lab-export --format`
offers the `release_layouts`, `init_from` and `lab-generate` read folders through them, the tests
parametrise over `example(k)`, and reports sort and compare by the traits.

A release layout writes and reads files, which needs lab.checkpoint's file helpers and the model
builder of lab.model.mtp — both sit above the heads. They are passed in as a `ReleaseIO` (built by
lab/checkpoint/layouts.py), so a head folder never imports upward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.inference.proposer import HeadDrafter
from lab.model.heads.base import MTPHead
from lab.model.heads.config import HeadConfig


@dataclass(frozen=True)
class ReleaseIO:
    """What a release layout needs from the layers above the heads (filled by lab/checkpoint/layouts.py)."""

    build_model: Callable[[Mapping, Mapping], Any]  # (model config, head config) -> MTPModel (lab.model.mtp)
    staged_folder: Callable[[Path], Any]  # context manager: a temp sibling renamed to `out` on success
    honour_umask: Callable[[Path], None]  # one file a library wrote 0600 gets the umask's mode
    honour_umask_in: Callable[[Path], None]  # every *.safetensors in a folder, the same
    write_trunk_folder: Callable[[dict, Any, Path], None]  # (checkpoint, model, folder): the trunk as a HF folder
    transformers_tokenizer: Callable[[dict, dict], Any]  # (tokenizer payload, manifest) -> a transformers tokenizer
    plain: Callable[[Any], Any]  # dataclasses to dicts, lists and scalars (JSON-safe)


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
    None selects it when the layout `recognizes` the folder.
    """

    kind: str
    read: Callable[[Path, Any, ReleaseIO], ParentWeights]  # (folder, this run's model, io)
    identity_file: Callable[[Path], Path]  # the file whose sha256 identifies the parent
    prefix: str | None = None


@dataclass(frozen=True)
class ReleaseLayout:
    """A format outside the harness that holds a head's weights (`lab-export --format <name>`)."""

    name: str
    help: str  # one line for `lab-export --help`
    export: Callable[[dict, Path, Any, ReleaseIO], str]  # (checkpoint, out, model, io) -> what to print
    recognizes: Callable[[Path], bool] | None = None  # a folder in this layout (lab-generate, init_from)
    load: Callable[[Path, ReleaseIO], LoadedFolder] | None = None  # lab-generate DIR
    init_from: InitFromReader | None = None
    check: Callable[[str, ReleaseIO], int] | None = None  # `lab-export --check DIR`: print a verdict, 0 when it passes


def no_example_options(k: int) -> Mapping:
    return {}


@dataclass(frozen=True)
class HeadSpec:
    """One head architecture. `config` and `drafter` are read off `module` (stated once, on the class
    that uses them); the report traits are the spec's own."""

    name: str
    module: type[MTPHead]
    display_rank: int  # where it stands in tables and figures (registry order for the shipped heads)
    release_layouts: Mapping[str, ReleaseLayout] = field(default_factory=dict)
    is_baseline: bool = False  # the plain next-token model every variant is compared with
    teacher_forced_metrics: bool = False  # horizon k ≥ 2 metrics see the true tokens up to t+k−1 (docs/metrics.md)
    # A head's K rule, for the tests' example configs and for sweep grids (`options_at`): `example_k` is the K the
    # head fixes (ntp: 1; None: any K), `example_options(k)` the fields it derives from K (deepseek: depth = K − 1).
    example_k: int | None = None
    example_options: Callable[[int], Mapping] = no_example_options
    config: type[HeadConfig] = field(init=False)
    drafter: type[HeadDrafter] | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", self.module.config_class)
        object.__setattr__(self, "drafter", self.module.drafter)

    @property
    def init_from_readers(self) -> list[InitFromReader]:
        return [layout.init_from for layout in self.release_layouts.values() if layout.init_from is not None]

    def example(self, k: int) -> dict:
        """The example config at K = `k` (the spec's own K when it fixes one)."""
        return {"name": self.name, **self.options_at(k)}

    def options_at(self, k: int) -> dict:
        """What `head.k=k` in a sweep grid means for this head: its own K when it fixes one, and the fields K decides."""
        k = self.example_k or k
        return {"k": k, **self.example_options(k)}

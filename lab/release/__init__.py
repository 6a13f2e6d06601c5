"""Release formats: the folders the harness writes for others and reads back.

The harness's own release and a `model=hf` trunk as a Hugging Face folder (export.py, hf_folder.py), and
the layouts a head's spec names in `HeadSpec.release_layouts` — DeepSeek's MTP layers (deepseek/) and
vLLM's Medusa folder (medusa.py) — registered here by format name. `lab-export --format`, `init_from`
and `lab-generate DIR` find a layout through the functions below. This package sits above the model
and the checkpoint files it writes with, and below training and decoding, which read through it.

A plugin's head with a layout of its own names it in its spec and calls `register_layout(layout)`.
"""

from __future__ import annotations

from pathlib import Path

from lab.errors import ConfigError
from lab.model.heads import declared_layouts
from lab.release import deepseek, medusa
from lab.release.layout import InitFromReader, LoadedFolder, ParentWeights, ReleaseLayout

SHIPPED = (deepseek.LAYOUT, medusa.LAYOUT)
LAYOUTS: dict[str, ReleaseLayout] = {layout.name: layout for layout in SHIPPED}


def register_layout(layout: ReleaseLayout) -> None:
    """Add a layout written outside this package (a plugin's, a test's); its format name must be new."""
    if layout.name in LAYOUTS:
        raise ConfigError("release_layouts", f"format '{layout.name}' is registered already")
    LAYOUTS[layout.name] = layout


def unregister_layout(name: str) -> None:
    """Remove a layout `register_layout` added (the shipped ones stay)."""
    if name in {layout.name for layout in SHIPPED}:
        raise ConfigError("release_layouts", f"'{name}' is a shipped layout; only layouts added with register_layout can be removed")
    LAYOUTS.pop(name, None)


def release_layouts() -> dict[str, ReleaseLayout]:
    """The layouts a registered head names (`lab-export --format`), in head registry order."""
    return {name: LAYOUTS[name] for name in declared_layouts() if name in LAYOUTS}


def init_from_readers() -> dict[str, InitFromReader]:
    """The `init_from` folder readers of those layouts, by the kind the manifest records."""
    return {layout.init_from.kind: layout.init_from for layout in release_layouts().values() if layout.init_from is not None}


def layout_of_folder(path: Path) -> ReleaseLayout | None:
    """The layout that recognises folder `path` (None: none does)."""
    return next((layout for layout in release_layouts().values() if layout.recognizes is not None and layout.recognizes(path)), None)


def checking_layout(path: Path) -> ReleaseLayout | None:
    """The layout whose `check` judges `path`: the one that recognises it, else the first that declares a check
    (a folder a layout no longer recognises is what its check reports on)."""
    layout = layout_of_folder(path)
    if layout is not None and layout.check is not None:
        return layout
    return next((layout for layout in release_layouts().values() if layout.check is not None), None)


__all__ = ["LAYOUTS", "InitFromReader", "LoadedFolder", "ParentWeights", "ReleaseLayout", "checking_layout", "init_from_readers",
           "layout_of_folder", "register_layout", "release_layouts", "unregister_layout"]

"""The release layouts the head folders declare (`HeadSpec.release_layouts`), wired to this layer's file helpers.

A layout lives with its head (lab/model/heads/<name>/) and writes and reads through a `ReleaseIO`: the
model builder and the file helpers that sit above the heads. `RELEASE_IO` is that bundle; the functions
below find a layout by format name or by the folder it recognises, for `lab-export`, `init_from` and `lab-generate`.
"""

from __future__ import annotations

from pathlib import Path

from lab.checkpoint.export_hf import honour_umask_in, staged_folder, transformers_tokenizer, write_trunk_folder
from lab.checkpoint.files import honour_umask
from lab.checkpoint.manifest import plain
from lab.model.heads import release_layouts
from lab.model.heads.spec import ReleaseIO, ReleaseLayout
from lab.model.mtp import build_model

RELEASE_IO = ReleaseIO(build_model=build_model, staged_folder=staged_folder, honour_umask=honour_umask, honour_umask_in=honour_umask_in,
                       write_trunk_folder=write_trunk_folder, transformers_tokenizer=transformers_tokenizer, plain=plain)


def layout_of_folder(path: Path) -> ReleaseLayout | None:
    """The registered layout that recognises folder `path` (None: none does)."""
    return next((layout for layout in release_layouts().values() if layout.recognizes is not None and layout.recognizes(path)), None)


def checking_layout(path: Path) -> ReleaseLayout | None:
    """The layout whose `check` judges `path`: the one that recognises it, else the first that declares a check
    (a folder a layout no longer recognises is what its check reports on)."""
    layout = layout_of_folder(path)
    if layout is not None and layout.check is not None:
        return layout
    return next((layout for layout in release_layouts().values() if layout.check is not None), None)

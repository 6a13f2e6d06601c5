"""The embedded corpus: the running interpreter's standard-library `.py` files, one document per file."""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from pathlib import Path

import datasets

from lab.data.corpus_split import Corpus, Selection, selection_hash, split_indices, require_nonempty, update_digest
from lab.data.local_files import read_utf8


# Tests and IDE code are huge, repetitive and not representative of ordinary code.
STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Standard-library `.py` files, relative to `root`, in sorted order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    found = []
    for directory, subdirs, names in os.walk(root):
        # Pruning in place keeps os.walk out of site-packages (which can be huge).
        subdirs[:] = sorted(d for d in subdirs if d not in STDLIB_SKIP_DIRS)
        found += [Path(directory, n).relative_to(root) for n in names if n.endswith(".py")]
    return sorted(found, key=lambda p: p.as_posix())


def load_stdlib(selection: Selection) -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    keys = [p.as_posix() for p in stdlib_files(root)]
    # Read in selection-hash order and stop at max_docs, so a capped corpus reads only what it keeps.
    chosen: dict[str, str] = {}
    for key in sorted(keys, key=selection_hash):
        if selection.max_docs is not None and len(chosen) >= selection.max_docs:
            break
        text = read_utf8(root / key)
        if text is not None and len(text) >= selection.min_doc_chars:
            chosen[key] = text
    keys = sorted(chosen)
    texts = [chosen[k] for k in keys]
    require_nonempty(len(keys), selection)

    digest = hashlib.sha256()
    update_digest(digest, {"source": "stdlib", "python": list(sys.version_info[:3]), **selection.as_dict()})
    for key, text in zip(keys, texts):
        update_digest(digest, key)
        update_digest(digest, text)
    train_idx, val_idx = split_indices(keys, selection.val_fraction)
    return Corpus(
        train=datasets.Dataset.from_dict({"text": [texts[i] for i in train_idx]}),
        val=datasets.Dataset.from_dict({"text": [texts[i] for i in val_idx]}),
        fingerprint=digest.hexdigest(),
        source="stdlib",
    )

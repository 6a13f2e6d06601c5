"""Atomic checkpoint writes with a content digest (Lightning `CheckpointIO` plugin).

A crash mid-write must leave the previous `last.ckpt` loadable, and bit rot must be
reported rather than silently loaded (torch.load does not verify its zip CRCs). Kept
apart from lab/checkpoint.py because importing Lightning is slow and the export
tool does not need it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from lab.checkpoint import content_digest


class SafeCheckpointIO(TorchCheckpointIO):
    """Atomic checkpoint writes with a content digest.

    Lightning's local save goes through an fsspec transaction whose temp file lives in
    the system temp dir; the final move is a copy when that is another filesystem, so a
    crash can leave a truncated `last.ckpt`. Here the temp file sits next to the target,
    is fsynced, and replaces it with one `os.replace`.
    """

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("SafeCheckpointIO takes no storage_options")
        checkpoint = {**checkpoint, "mtp_digest": content_digest(checkpoint)}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as file:
                self._write(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)

    def _write(self, checkpoint: dict, file) -> None:
        torch.save(checkpoint, file)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (best effort: not every platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

"""Atomic checkpoint writes with a content digest (Lightning `CheckpointIO` plugin).

A crash mid-write must leave the previous `last.ckpt` loadable, and bit rot must be
reported rather than silently loaded (torch.load does not verify its zip CRCs). Kept
apart from lab/checkpoint/loading.py (what the export tool imports) because importing Lightning is slow and the export
tool does not need it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from lab.checkpoint import content_digest
from lab.checkpoint.files import create_partial, fsync_dir, os_error_in


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
        fd, tmp = create_partial(path)
        try:
            with os.fdopen(fd, "wb") as file:
                self._write(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, path)
        except BaseException as error:
            tmp.unlink(missing_ok=True)
            cause = os_error_in(error)
            if cause is not None and cause.errno is not None and (cause is not error or cause.filename is None):
                # torch's zip writer turns a failed write (e.g. a full disk) into "unexpected pos N vs M"
                raise OSError(cause.errno, cause.strerror, str(path)) from error
            raise
        fsync_dir(path.parent)

    def _write(self, checkpoint: dict, file) -> None:
        torch.save(checkpoint, file)

"""File-system helpers for run files: temp files that honour the umask, orphan cleanup, OS-error causes.

Kept free of Lightning and torch so that `lab-export` and `lab.train`'s start-up checks can use them.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

PARTIAL_SUFFIX = ".partial"  # a temp file being written (lab/checkpoint/io.py)
STAGED_SUFFIX = ".staged"  # a complete checkpoint waiting for its rows (lab/callbacks/recorded_checkpoint.py)


def create_partial(path: Path) -> tuple[int, Path]:
    """A new temp file next to `path` (`.<name>.<random>.partial`), created with the umask's mode like every run file."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def orphaned_partials(folder: Path) -> list[Path]:
    """Temp files a killed writer left in `folder` (no live writer exists when a run starts)."""
    return sorted(folder.glob(f".*{PARTIAL_SUFFIX}")) if folder.is_dir() else []


def staged_path(filepath: str | os.PathLike) -> Path:
    path = Path(filepath)
    return path.with_name(f".{path.name}{STAGED_SUFFIX}")


def orphaned_staged(folder: Path) -> list[Path]:
    """Staged checkpoints a killed run never put in place (their rows may be missing: never resume from them)."""
    return sorted(folder.glob(f".*{STAGED_SUFFIX}")) if folder.is_dir() else []


def os_error_in(error: BaseException) -> OSError | None:
    """The OSError behind `error` (itself, or in its cause/context chain), if any."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, OSError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def current_umask() -> int:
    """The process umask (read from /proc where possible: setting it to read it is not thread-safe)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: Path) -> None:
    """Give a file created by a library with a fixed mode (safetensors writes 0600) the umask's mode."""
    os.chmod(path, 0o666 & ~current_umask())


def fsync_dir(folder: Path) -> None:
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

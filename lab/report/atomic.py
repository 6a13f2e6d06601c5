"""Report files written whole or not at all, by any number of processes at once.

Each writer stages its bytes in a temp file of its own beside the target (hidden, named by
pid and a random suffix) and renames it into place: a reader sees the old file or the new
one, never half of one, and two `lab-report` runs on one sweep never rename each other's
temp file away (one fixed `<name>.tmp` made the second writer's rename fail).
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

TEMP_NAME = re.compile(r"^\..+\.(?P<pid>\d+)-[0-9a-f]{8}\.tmp$")  # what temp_beside names


def temp_beside(path: Path) -> Path:
    """A temp path in `path`'s folder that no other process uses."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


def write_text_atomic(path: Path, text: str) -> Path:
    path = Path(path)
    tmp = temp_beside(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only left when the write or the rename failed
    return path


def remove_stale_temps(folder: Path) -> list[Path]:
    """Remove the temp files a killed writer left in `folder` (named by temp_beside, their pid no longer running);
    a live writer's stay. Returns what was removed."""
    removed = []
    for path in Path(folder).glob(".*.tmp") if Path(folder).is_dir() else ():
        match = TEMP_NAME.match(path.name)
        if match and not pid_alive(int(match.group("pid"))):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (someone else's live process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True

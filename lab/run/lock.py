"""One process per run or sweep directory: an exclusive lock held for the life of the process.

Two `lab-train` on one run directory would interleave their metrics.csv rows and overwrite
each other's run.json; two `lab-resume` on one sweep would train the same jobs twice. The
first process takes an exclusive `flock` on `<dir>/.lock` and writes its pid and host into
the file; a second one stops with one line naming that holder. The kernel drops the lock when
its holder exits or is killed, so a lock file left behind by a dead process never blocks the
next attempt. Where the file system refuses `flock` (some network mounts), the file's pid and
host decide instead: a holder on this host whose pid is gone is stale and is taken over.

Under DDP (or Slurm tasks) only the process of global rank 0 locks: the other ranks run the
same job in the same directory on purpose.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path

from lab.errors import ConfigError
from lab.report.atomic import pid_alive

LOCK_NAME = ".lock"
_held: dict[str, int] = {}  # resolved lock path -> open descriptor (closing it releases the lock)


def is_launching_rank() -> bool:
    """Rank 0 as the launcher's environment says it (Lightning's RANK/LOCAL_RANK/NODE_RANK, Slurm's SLURM_PROCID)."""
    return all(int(os.environ.get(name, 0) or 0) == 0 for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))


def holder_of(path: Path) -> tuple[int | None, str]:
    """(pid, host) written by the process holding `path` ((None, '') when unreadable)."""
    try:
        pid, _, host = path.read_text().strip().partition(" on ")
        return int(pid.removeprefix("pid ")), host
    except (OSError, ValueError):
        return None, ""


def _stale_or_busy(path: Path) -> bool:
    """Without flock: busy unless the recorded holder is this process or a dead process on this host."""
    pid, host = holder_of(path)
    if pid is None or pid == os.getpid():
        return False
    return host != socket.gethostname() or pid_alive(pid)


def lock_directory(folder: Path, field: str) -> None:
    """Hold `<folder>/.lock` until this process exits (or `unlock_directory`); refuse in one line when another process holds it."""
    if not is_launching_rank():
        return
    path = Path(folder) / LOCK_NAME
    key = str(path.resolve())
    if key in _held:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        busy = False
    except BlockingIOError:
        busy = True
    except OSError as error:  # ENOLCK, EOPNOTSUPP: no flock on this file system
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            os.close(fd)
            raise
        busy = _stale_or_busy(path)
    if busy:
        os.close(fd)
        pid, host = holder_of(path)
        holder = f"pid {pid} on {host}" if pid is not None else "another process"
        raise ConfigError(field, f"{folder} is in use by {holder} (lock {path}); wait for it to end or stop it")
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    _held[key] = fd


def unlock_directory(folder: Path) -> None:
    fd = _held.pop(str((Path(folder) / LOCK_NAME).resolve()), None)
    if fd is not None:
        os.close(fd)

"""Start-up checks of the paths a run uses, and faults as one line naming the path and the cause.

- `RunDirGuard` (a Hydra callback, conf/hydra/default.yaml) refuses an unwritable run or
  sweep directory before Hydra configures its log file there (which would end in
  `ValueError: Unable to configure handler 'file'`), and one another process holds
  (lab/run/lock.py); it notes the folders it makes (the latest run's only, by its run dir), so that `discard_new_run_dir`
  can take a refused first attempt's folder away again (no folder is left behind by bad input); and it keeps a run directory's `.hydra/`
  files those of its first attempt: a resume (`hydra.run.dir=<existing run> ckpt_path=last`)
  records its own overrides in run.json's `attempts` instead of replacing the run's. (A start
  without ckpt_path in an unfinished run's folder trains from step 0: its files replace them;
  a finished run's folder refuses it, lab/run/attempts.py.)
- `check_paths` checks, before anything is built, that the corpus files can be read, the
  cache and wandb folders can be written.
- `fault_reason` turns an OSError (permission denied, no space left on device, read-only
  file system, ...) into `<field>: cannot <access> <path>: <cause>`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from lab.errors import ConfigError, require
from lab.run.lock import lock_directory, unlock_directory

HYDRA_SUBDIR_MARKER = "overrides.yaml"


def cause(error: OSError) -> str:
    """"permission denied", "no space left on device", ... (the OS's words, lower case)."""
    if error.errno is not None:
        return os.strerror(error.errno).lower()
    return str(error.strerror or error).lower()


PROBE_BYTES = 64 * 1024  # more than Hydra's config files and a first run.json: a full disk fails here, not half-way through them


def require_writable(folder: Path, field: str) -> None:
    """Create `folder` if needed and write/remove a probe file in it; refuse with one line otherwise (and remove
    the folders this check made, so a refused start leaves nothing behind)."""
    folder = Path(folder)
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # the folders mkdir is about to create, deepest first
    probe = folder / f".write-probe-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                write_all(fd, bytes(PROBE_BYTES))
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            probe.unlink(missing_ok=True)
    except OSError as error:
        for path in made:
            with contextlib.suppress(OSError):
                path.rmdir()  # only if still empty
        where = folder if error.filename in (None, str(probe)) else error.filename
        raise ConfigError(field, f"cannot write {where}: {cause(error)}") from None


def write_all(fd: int, data: bytes) -> None:
    """Every byte of `data`, or OSError(ENOSPC): a nearly full disk takes part of a write and returns its count."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]


def require_readable(file: Path, field: str) -> None:
    try:
        with open(file, "rb") as handle:
            handle.read(1)
    except FileNotFoundError:
        return  # the source's own check names a missing file
    except OSError as error:
        raise ConfigError(field, f"cannot read {file}: {cause(error)}") from None


def local_corpus_files(data: dict) -> list[Path]:
    if data.get("source") in (None, "stdlib", "hub") or data.get("path") is None:
        return []
    paths = [data["path"]] if isinstance(data["path"], (str, os.PathLike)) else list(data["path"])
    paths = [Path(os.path.expanduser(str(p))) for p in paths]
    return [p for p in paths if not p.is_dir()]  # a folder's files are read by the corpus loader, which names a bad one


def check_paths(cfg: DictConfig) -> None:
    """Corpus files readable, cache and wandb folders writable: checked before the run dir is touched."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    for file in local_corpus_files(data):
        require_readable(file, "data.path")
    if data.get("cache_dir"):
        require_writable(Path(os.path.expanduser(str(data["cache_dir"]))), "data.cache_dir")
    wandb_dir = OmegaConf.select(cfg, "logger.wandb.save_dir")
    if wandb_dir:  # wandb itself would fall back to a folder under the system temp dir, outside the folders chosen
        require_writable(Path(os.path.expanduser(str(wandb_dir))), "logger.wandb.save_dir")
        require_writable(Path(os.path.expanduser(str(wandb_dir))) / "wandb", "logger.wandb.save_dir")  # where wandb writes its runs


def fault_field(path: str | None, cfg: DictConfig, run_dir: Path) -> str:
    """The setting a faulty path belongs to (the most specific folder wins)."""
    if not path:
        return "io"
    path = os.path.abspath(path)
    candidates = {"checkpoint": OmegaConf.select(cfg, "callbacks.checkpoint.dirpath"), "hydra.run.dir": str(run_dir)}
    candidates["data.cache_dir"] = OmegaConf.select(cfg, "data.cache_dir")
    candidates.update({"data.path": str(file) for file in local_corpus_files(OmegaConf.to_container(cfg.data, resolve=True))})
    best, best_len = "io", -1
    for field, root in candidates.items():
        if not root:
            continue
        root = os.path.abspath(os.path.expanduser(str(root)))
        if (path == root or path.startswith(root.rstrip(os.sep) + os.sep)) and len(root) > best_len:
            best, best_len = field, len(root)
    return best


def fault_reason(error: OSError, cfg: DictConfig, run_dir: Path) -> str:
    """`<field>: cannot access <path>: <cause>` for an OSError raised while a run starts or trains."""
    path = error.filename
    verb = "write" if error.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT) else "access"
    return f"{fault_field(path, cfg, run_dir)}: cannot {verb} {path or '(unknown path)'}: {cause(error)}"


def check_not_overwriting(ckpt_path: str | None, finished: bool, run_dir: Path) -> None:
    """A finished run is never trained over: another attempt in its folder must resume its own checkpoint.

    Without this, `lab-train <other overrides> hydra.run.dir=<finished run>` retrained from step 0 and
    replaced its checkpoint and metrics while run.json and .hydra/ kept describing the first run.
    RunDirGuard asks before Hydra writes into the folder; lab/train.py again (sweep jobs)."""
    if not finished or ckpt_path == "last":
        return
    own = ckpt_path is not None and Path(str(ckpt_path)).resolve().is_relative_to(Path(run_dir).resolve())
    require(own, "hydra.run.dir",
            f"{run_dir} holds a finished run (run.json: ok); it is never overwritten: choose another hydra.run.dir, "
            "or continue it with its own overrides and ckpt_path=last")


def recorded_status(run_dir: Path) -> str | None:
    """The status run.json gives the run in `run_dir` (None: no readable record)."""
    try:
        return json.loads((run_dir / "run.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def refuse(field: str, message: str) -> None:
    print(f"error: {field}: {message}", file=sys.stderr)
    sys.exit(2)


class RunDirGuard(Callback):
    """Hydra callback: unwritable run/sweep dirs are refused, and so is a run, job or sweep dir
    another process is using (lab/run/lock.py); a re-attempt keeps the run's `.hydra/` files."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = Path(os.path.abspath(str(config.hydra.run.dir)))
        note_run_dir(run_dir)
        try:
            require_writable(run_dir, "hydra.run.dir")
            lock_directory(run_dir, "hydra.run.dir")  # before Hydra writes its log and .hydra/ files there
            check_not_overwriting(config.get("ckpt_path"), recorded_status(run_dir) == "ok", run_dir)
        except ConfigError as error:
            discard_new_run_dir(run_dir)  # the folders require_writable made before it was refused
            refuse(error.field, error.message)
        subdir = config.hydra.output_subdir
        resuming = config.get("ckpt_path") is not None  # a fresh start (no ckpt_path) records its own .hydra/ files
        if resuming and subdir is not None and (run_dir / str(subdir) / HYDRA_SUBDIR_MARKER).is_file():
            with read_write(config.hydra), open_dict(config.hydra):
                config.hydra.output_subdir = None  # run.json's attempts hold this attempt's overrides

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        try:
            require_writable(sweep_dir, "hydra.sweep.dir")
            lock_directory(sweep_dir, "hydra.sweep.dir")  # also keeps `lab-resume` off a running sweep
        except ConfigError as error:
            refuse(error.field, error.message)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if is_sweep_job(config):  # a single run locked its dir in on_run_start
            try:
                lock_directory(Path(str(config.hydra.runtime.output_dir)), "hydra.sweep.subdir")
            except ConfigError as error:
                refuse(error.field, error.message)

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if is_sweep_job(config):  # the next job of this launcher process locks its own dir
            unlock_directory(Path(str(config.hydra.runtime.output_dir)))


@dataclass(frozen=True)
class RunDirNote:
    """What on_run_start found at its run dir, before anything was written there."""

    made: tuple[Path, ...] = ()  # the folders it is about to make: the run dir first, then its new parents
    held: frozenset[str] | None = None  # an existing folder that held no run yet: the names it held


# The latest on_run_start's note, keyed by its run dir; at most one entry. Per process, not per run: the in-process
# test runner and other callers of the entry point run several runs in one process, and an earlier run's note (a
# finished run's too) must never let a later refusal remove that folder, or answer for another one.
_noted: dict[Path, RunDirNote] = {}


def note_run_dir(run_dir: Path) -> None:
    """Note what `run_dir` is now (the folders still to make, or what a folder without a run holds), replacing
    every earlier note of this process."""
    made = tuple(missing_folders(run_dir))
    held = None if made or (run_dir / "run.json").exists() else frozenset(os.listdir(run_dir))
    _noted.clear()
    _noted[run_dir] = RunDirNote(made, held)


def missing_folders(run_dir: Path) -> list[Path]:
    """`run_dir` and those of its parents that do not exist yet, innermost first."""
    missing = []
    for folder in [run_dir, *run_dir.parents]:
        if folder.exists():
            break
        missing.append(folder)
    return missing


def discard_new_run_dir(run_dir: Path) -> bool:
    """Remove the run folder (and its new parents, when empty) if this process made it; True when removed.
    An existing folder that held no run keeps what it held and loses what this attempt added.

    For an attempt refused before it began: the folder then holds only Hydra's files and the lock."""
    run_dir = Path(os.path.abspath(run_dir))
    note = _noted.pop(run_dir, None)  # none: this process's latest start was elsewhere (or never noted this folder)
    if note is not None and note.held is not None and run_dir.is_dir():
        for name in set(os.listdir(run_dir)) - note.held:
            path = run_dir / name
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
        return True
    if note is None or not note.made:
        return False
    shutil.rmtree(note.made[0], ignore_errors=True)
    for parent in note.made[1:]:
        try:
            parent.rmdir()  # only when empty: another run may have made a folder next to ours meanwhile
        except OSError:
            break
    return True


def is_sweep_job(config: DictConfig) -> bool:
    return config.hydra.mode == RunMode.MULTIRUN

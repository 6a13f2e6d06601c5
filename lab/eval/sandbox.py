"""Run untrusted Python (a model's completion and its tests) in a sandbox: one subprocess per program.

What contains it (each layer stands alone; together they cover the hostile cases in tests/test_sandbox.py):

- limits (resource.setrlimit in the child, before any of its code runs): CPU seconds, address space,
  the size of any file it writes (so an output flood stops), no core files, a process count;
- a wall-clock limit, after which the child's whole process group is killed (it runs in a new session);
- a fresh temporary folder as its working directory and HOME, removed afterwards whatever happened;
  an environment of PATH, HOME, TMPDIR and LANG only (none of the parent's variables, so no secrets);
- when started as root: a network namespace of its own (no interface but a down loopback). It keeps
  the user: switching to `nobody` would leave it unable to import the standard library wherever the
  interpreter lives in a folder only its owner reads (e.g. under /root);
- an audit hook (sys.addaudithook, installed before the program is compiled) that refuses writes,
  deletions and renames outside the folder, new processes (fork, exec, spawn, subprocess, system),
  sockets and ctypes. Python's audit hooks are not a security boundary on their own; here they back
  the limits and the user switch, and they turn each refusal into a readable reason.

A program passes when it returns normally: the runner then writes a token to a pipe only it holds.
`sys.exit(0)` or `os._exit(0)` before the tests finished leaves no token and is a failure.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 2 << 30  # address space: torch-free Python needs well under this
    output_bytes: int = 1 << 20  # any file the program writes, its stdout and stderr included
    processes: int = 64  # RLIMIT_NPROC (the user's processes; root ignores it: the audit hook refuses new processes)


@dataclass(frozen=True)
class Outcome:
    passed: bool
    reason: str  # "passed", or why not: the exception's last line, "timed out …", "output limit …", …
    seconds: float
    stdout: str = ""



# Runs in the child as `python -I -B -c RUNNER <folder> <token fd> <limits…>`: limits, isolation, the audit hook, then the program.
RUNNER = r'''
import os, resource, sys
folder, token_fd = sys.argv[1], int(sys.argv[2])
cpu_s, memory, output, processes = (int(x) for x in sys.argv[3:7])
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (output, output))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if os.geteuid() == 0:
    import ctypes
    ctypes.CDLL(None, use_errno=True).unshare(0x40000000)  # CLONE_NEWNET: best effort (a container may refuse it)
resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))  # a non-root user's processes (root ignores it)
os.chdir(folder)
root = os.path.realpath(folder) + os.sep
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
REFUSED = ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen", "os.kill",
           "os.killpg", "socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym",
           "ctypes.call_function", "os.setuid", "os.chroot", "sys.addaudithook", "os.putenv", "os.unsetenv")
PATHS = ("os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link", "os.truncate",
         "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile")
def inside(path):
    return isinstance(path, int) or os.path.realpath(os.fsdecode(path)).startswith(root)
def hook(event, args):
    if event in REFUSED or event.startswith("os.exec") or event.startswith("os.spawn"):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and len(args) > 2 and isinstance(args[2], int) and args[2] & WRITE and not inside(args[0]):
        raise PermissionError(f"sandbox: writing {args[0]} outside the sandbox folder")
    if event == "open" and len(args) > 1 and isinstance(args[1], str) and set(args[1]) & set("wax+") and not inside(args[0]):
        raise PermissionError(f"sandbox: writing {args[0]} outside the sandbox folder")
    if event in PATHS and args and not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
        raise PermissionError(f"sandbox: {event} outside the sandbox folder")
source = open("program.py").read()
sys.addaudithook(hook)
code = compile(source, "program.py", "exec")
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
os.write(token_fd, sys.argv[7].encode())
'''


def run_sandboxed(program: str, limits: Limits = Limits()) -> Outcome:
    """Run `program` (Python source) in a fresh sandbox; passed when it returns normally."""
    folder = Path(tempfile.mkdtemp(prefix="lab-sandbox-"))
    token = secrets.token_hex(16)
    read_end, write_end = os.pipe()
    begin = time.perf_counter()
    try:
        (folder / "program.py").write_text(program)
        with open(folder / "output.txt", "wb") as output:
            argv = [sys.executable, "-I", "-B", "-c", RUNNER, str(folder), str(write_end), str(limits.cpu_s), str(limits.memory_bytes),
                    str(limits.output_bytes), str(limits.processes), token]
            child = subprocess.Popen(argv, cwd=folder, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                     env=clean_environment(folder), pass_fds=(write_end,), start_new_session=True)
            os.close(write_end)
            write_end = -1
            returncode = wait_or_kill(child, limits.wall_s)
        seconds = time.perf_counter() - begin
        finished = os.read(read_end, 64).decode(errors="replace") == token
        flooded = (folder / "output.txt").stat().st_size >= limits.output_bytes
        text = (folder / "output.txt").read_bytes()[: 1 << 16].decode("utf-8", errors="replace")
        return Outcome(finished and returncode == 0, verdict(finished, returncode, text, limits, seconds, flooded), seconds, text)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
        shutil.rmtree(folder, ignore_errors=True)


def clean_environment(folder: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(folder), "TMPDIR": str(folder), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


def wait_or_kill(child: subprocess.Popen, wall_s: float) -> int | None:
    """The child's return code, or None when it ran past `wall_s`; its process group is killed either way."""
    try:
        return child.wait(timeout=wall_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)  # anything it started, in its session
        except (ProcessLookupError, PermissionError):
            pass
        child.wait()


def verdict(finished: bool, returncode: int | None, output: str, limits: Limits, seconds: float, flooded: bool) -> str:
    if finished and returncode == 0:
        return "passed"
    if returncode is None:
        return f"timed out after {limits.wall_s:g} s (wall)"
    if returncode == -signal.SIGXCPU or returncode == -signal.SIGKILL and seconds >= limits.cpu_s:
        return f"CPU limit ({limits.cpu_s} s)"
    if flooded or returncode == -signal.SIGXFSZ:  # CPython ignores SIGXFSZ: the write fails with EFBIG instead
        return f"output limit ({limits.output_bytes} bytes)"
    last = [line for line in output.strip().splitlines() if line.strip()]
    if returncode not in (0, None) and last:
        return last[-1][:300]
    return f"exited (code {returncode}) before the tests finished"

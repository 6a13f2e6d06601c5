"""Run untrusted Python (a model's completion and its tests) in a sandbox: one process tree per program.

What contains it (each layer stands alone; together they cover the hostile cases in tests/test_sandbox.py):

- limits (resource.setrlimit before the program's interpreter starts): CPU seconds (the wall limit, rounded up),
  address space, the size of any file it writes (so an output flood stops), no core files, and for a non-root
  user a process count;
- a wall-clock limit, after which the whole process group is killed (the tree runs in a session of its own);
- a fresh temporary box: `work/` is the working directory, HOME and TMPDIR; the box is removed afterwards
  whatever happened. The environment is PATH, HOME, TMPDIR and LANG only (none of the parent's variables);
- when started as root, and only if the kernel allows it (checked, and reported in `Outcome.network`):
  a network namespace of its own (no interface but a down loopback) and a PID namespace, in which the
  program is not PID 1, so when the tree ends the kernel kills whatever is left in it, and other processes,
  the evaluator included, cannot be named. Capabilities a program has no use for (mknod, ptrace, raw I/O,
  sys_admin, sys_resource, …) are dropped from the bounding set before its interpreter starts;
- an audit hook (sys.addaudithook, installed before the program is compiled; `guard` below) that refuses:
  writes, deletions, renames and links outside `work/` (paths resolved symlink by symlink with the kernel's
  lstat/readlink; opening a folder outside is refused, so every dir_fd is inside, and `..` is refused in a
  path that may be relative to one), symlinks, `chdir`, sqlite3 (it opens files the hook never sees), reading
  /proc, /sys and devices other than null/zero/random; new processes (fork, forkpty, exec, spawn, posix_spawn, system, and importing
  `_posixsubprocess`, whose fork_exec raises no event, so subprocess and asyncio cannot be imported); every
  socket operation (creation included, so no UDP sendmsg, no DNS lookup); ctypes and the C-API test modules;
  raising resource limits; tracing and gc introspection.
  Python's audit hooks are not a security boundary on their own (a C function that raises no event is not
  seen: `os.mkfifo` outside the folder, for one); here they back the limits and namespaces, and they turn
  each refusal into a readable reason.

How a pass is learned. A program passes when it returns normally. The harness never hands the program a
secret to echo: it reads the verdict from `outcome`, a file in the box outside `work/`. The first line
is written by the trusted setup before any program code runs (whether the network is isolated); the
runner appends `finished` only after `exec` of the program returned. The hook refuses writes to
`outcome` unless the code asking is the runner's own top-level frame (`sys._getframe(1) is` the frame it
captured at install). A program can reach that frame (frames are not hidden), but no frame it creates is
that one, and with tracing refused it cannot make that frame jump. Everything the hook uses is bound as a
closure value when it is installed: it reads no global or builtin name, so rebinding `__main__`'s names,
`os.path.realpath` or `builtins.len` changes nothing it checks; the hook itself is reachable only through
gc, which is refused. `sys.exit(0)` or `os._exit(0)` before the tests finished leaves no `finished` line
and is a failure.
"""

from __future__ import annotations

import inspect
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int | None = None  # None: the wall limit rounded up, so a single-threaded program always meets the wall limit first
    memory_bytes: int = 2 << 30  # address space: torch-free Python needs well under this
    output_bytes: int = 1 << 20  # any file the program writes, its stdout and stderr included
    processes: int = 64  # RLIMIT_NPROC for a non-root user (root ignores it: the audit hook and the PID namespace hold processes)

    def __post_init__(self):
        if self.cpu_s is None:
            object.__setattr__(self, "cpu_s", max(1, math.ceil(self.wall_s)))


@dataclass(frozen=True)
class Outcome:
    passed: bool
    reason: str  # "passed", or why not: the exception's last line, "timed out …", "output limit …", …
    seconds: float
    stdout: str = ""
    network: str = "unknown"  # "isolated", or "shared: why" (the namespace was not available)


def guard(root: str, outcome: str, main_frame):
    """The audit hook: refuse what a program must not do, with a readable reason.

    Everything it uses is bound here, as closure values: it reads no global or builtin name, so a program
    that rebinds `os`, `__main__`'s names or `builtins.len` changes nothing it checks. It never calls a
    program's code either: arguments are used only when their type is exactly str, bytes or int.
    """
    import _stat
    import posix
    import sys as system
    from types import MappingProxyType

    getframe, lstat, readlink, is_link, is_folder = system._getframe, posix.lstat, posix.readlink, _stat.S_ISLNK, _stat.S_ISDIR
    refused_error, os_error, show, freeze = PermissionError, OSError, repr, tuple
    text, raw, number, kind, length = str, bytes, int, type, len
    write_flags = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND
    refused = frozenset({"os.fork", "os.forkpty", "os.system", "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen",
                         "os.chdir", "os.symlink", "os.chroot", "os.putenv", "os.unsetenv", "sys.addaudithook", "sys.settrace",
                         "sys.setprofile", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "resource.setrlimit",
                         "resource.prlimit", "sqlite3.connect", "sqlite3.enable_load_extension", "os.setxattr", "os.removexattr"})
    refused_prefixes = ("os.exec", "os.spawn", "os.posix_spawn", "socket.", "ctypes.", "_xxsubinterpreters.", "syslog.")
    refused_modules = frozenset({"_posixsubprocess", "ctypes", "_ctypes", "_xxsubinterpreters", "_xxinterpchannels", "readline",
                                 "_dbm", "_gdbm", "_tkinter"})
    # event: (indices of its path arguments, indices of its dir_fd arguments); -1 or None is "no dir_fd"
    # read-only, like every value here: a signal handler that runs inside the hook sees its locals, and finds nothing to change
    path_events = MappingProxyType({
        "os.mkdir": ((0,), (2,)), "os.rmdir": ((0,), (1,)), "os.remove": ((0,), (1,)), "os.rename": ((0, 1), (2, 3)),
        "os.link": ((0, 1), (2, 3)), "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.utime": ((0,), (3,)),
        "os.truncate": ((0,), ()), "shutil.rmtree": ((0,), (1,)), "shutil.move": ((0, 1), ()),
        "shutil.copyfile": ((0, 1), ()), "shutil.copytree": ((0, 1), ())})
    readable = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/dev/full"})
    inside = root + "/"

    # One function, no helpers: a helper would be a value in its closure, and a function's own closure and defaults can be
    # rebound by whoever holds it
    def hook(event, args):
        if event in refused or event.startswith(refused_prefixes):
            raise refused_error("sandbox: " + event + " is not allowed")
        if event == "import":
            name = args[0] if length(args) else None
            if kind(name) is text and (name in refused_modules or name.startswith("_test")):
                raise refused_error("sandbox: importing " + name + " is not allowed")
            return
        if event == "open" and length(args) == 3:
            flags = args[2]
            writing = kind(flags) is not number or flags & write_flags
            if kind(args[0]) is number:
                return  # an fd the process already holds
            paths, dir_fd = (args[0],), args[1] is None  # os.open's event has no mode, and does not say whether it had a dir_fd
        elif event in path_events:
            positions, dir_fds = path_events[event]
            paths, writing, dir_fd = (), True, False
            for index in dir_fds:
                if index < length(args) and args[index] is not None and not (kind(args[index]) is number and args[index] == -1):
                    dir_fd = True
            for index in positions:  # a loop, not a generator (a function of its own, with globals); a tuple, not a list
                if index < length(args):
                    paths = paths + (args[index],)
        else:
            return
        for path in paths:
            if kind(path) is raw:
                path = path.decode("utf-8", "surrogateescape")
            elif kind(path) is number:
                try:
                    path = readlink("/proc/self/fd/" + text(path))  # the file an fd names (chmod, chown, utime, truncate of an fd)
                except os_error:
                    raise refused_error("sandbox: " + event + " of an fd that names no file") from None
            elif kind(path) is not text:
                raise refused_error("sandbox: " + event + " needs a str or bytes path")
            # A dir_fd is never outside the folder (opening a folder outside is refused below), so a path relative to
            # it stays inside unless it climbs: refuse `..` where a dir_fd may be in play; resolve the rest from the folder
            if dir_fd and not path.startswith("/") and ".." in freeze(path.split("/")):
                raise refused_error("sandbox: " + ("os.open" if event == "open" else event) + " of " + show(path)
                                    + ": '..' in a path that may be relative to a dir_fd")
            # resolve as the kernel will: each existing component with lstat, each symlink through readlink (tuples, not lists)
            parts, done, hops, at = freeze((path if path.startswith("/") else inside + path).split("/")), "", 0, 0
            while at < length(parts):
                part, at = parts[at], at + 1
                if part in ("", "."):
                    continue
                if part == "..":
                    done = done.rpartition("/")[0]
                    continue
                here = done + "/" + part
                try:
                    mode = lstat(here).st_mode
                except os_error:
                    done = here  # not there (yet): as written
                    continue
                if is_link(mode):
                    hops = hops + 1
                    if hops > 40:
                        raise refused_error("sandbox: too many symlinks in " + show(path))
                    target = readlink(here)
                    parts, at = freeze(target.split("/")) + parts[at:], 0
                    done = "" if target.startswith("/") else done
                    continue
                done = here
            real = done or "/"
            if writing and not (real == root or real.startswith(inside)):
                if real == outcome and getframe(1) is main_frame:
                    continue  # the runner recording that the program returned normally
                raise refused_error("sandbox: writing " + show(path) + " outside the sandbox folder" if event == "open"
                                    else "sandbox: " + event + " of " + show(path) + " outside the sandbox folder")
            if not writing and (real.startswith(("/proc/", "/sys/")) or real in ("/proc", "/sys")
                                or real.startswith("/dev/") and real not in readable):
                raise refused_error("sandbox: reading " + show(path) + " is not allowed")
            if event == "open" and not (real == root or real.startswith(inside)):
                try:
                    folder = is_folder(lstat(real).st_mode)
                except os_error:
                    folder = False
                if folder:  # its fd would be a dir_fd outside, and what is relative to that is not checked
                    raise refused_error("sandbox: opening the folder " + show(path) + " outside the sandbox folder")

    return hook


# Stage 1, trusted (no program code runs in it): limits, namespaces, dropped capabilities, the first line of the
# outcome; then it starts the program's own interpreter (stage 2), which loads nothing of what stage 1 used (ctypes).
SETUP = r'''
import os, resource, signal, sys
runner, work, outcome = sys.argv[1:4]
cpu_s, memory, output, processes = (int(x) for x in sys.argv[4:8])
resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (output, output))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

def isolate():
    """(network, pid namespace): unshare as root; a container may refuse it, and then the network is shared."""
    if os.geteuid() != 0:
        return "shared: not root, so no network namespace", False
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    network, pid_namespace = "isolated", True
    if libc.unshare(0x40000000 | 0x20000000) != 0:  # CLONE_NEWNET | CLONE_NEWPID
        pid_namespace = False
        if libc.unshare(0x40000000) != 0:
            network = "shared: unshare(CLONE_NEWNET) failed: " + os.strerror(ctypes.get_errno())
    # linux_immutable, net_admin, net_raw, sys_module, sys_rawio, sys_ptrace, sys_admin, sys_boot, sys_resource, sys_time, mknod
    for cap in (9, 12, 13, 16, 17, 19, 21, 22, 24, 25, 27):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP: gone after exec; best effort
    return network, pid_namespace

DEADLY = {signal.SIGXCPU, signal.SIGKILL, signal.SIGXFSZ, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGTERM}

def relay(pid):
    """Wait for `pid` and end as it ended: its exit code, or 128 + its signal."""
    status = os.waitpid(pid, 0)[1]
    os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))

network, pid_namespace = isolate()
if os.geteuid() != 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
with open(outcome, "w") as record:
    record.write(f"network: {network}\n")
if pid_namespace:
    init = os.fork()  # PID 1 of the namespace: when it ends, the kernel kills everything left in it
    if init:
        code = os.waitstatus_to_exitcode(os.waitpid(init, 0)[1])
        number = -code if code < 0 else code - 128
        if number in DEADLY:  # the program died of a signal: die of it too, so the harness reads -signal
            if number != signal.SIGKILL:
                signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
        os._exit(max(code, 1) if code < 0 else code)
    program = os.fork()  # not PID 1, which ignores signals it has no handler for (SIGXCPU)
    if program:
        relay(program)
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: its parent killed, so is it (it may leave the process group)
os.execv(sys.executable, [sys.executable, "-I", "-B", "-c", runner, work, outcome])
'''

# Stage 2: the program's interpreter. The hook is installed before the program is compiled; `finished` is written
# by this frame only, after exec returned.
RUNNER = textwrap.dedent(inspect.getsource(guard)) + r'''
import os, sys
work, outcome = sys.argv[1], sys.argv[2]
os.chdir(work)
source = open("program.py").read()
sys.addaudithook(guard(os.path.realpath(work), os.path.realpath(outcome), sys._getframe()))
del guard
code = compile(source, "program.py", "exec")
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
with open(outcome, "a") as record:
    record.write("finished\n")
try:
    sys.stdout.flush()
    sys.stderr.flush()
finally:
    os._exit(0)  # threads the program left running do not hold the verdict back
'''


def run_sandboxed(program: str, limits: Limits = Limits()) -> Outcome:
    """Run `program` (Python source) in a fresh sandbox; passed when it returns normally."""
    box = Path(tempfile.mkdtemp(prefix="lab-sandbox-"))
    work, outcome, output_path = box / "work", box / "outcome", box / "output.txt"
    begin = time.perf_counter()
    try:
        work.mkdir()
        (work / "program.py").write_text(program)
        outcome.write_text("")
        with open(output_path, "wb") as output:
            argv = [sys.executable, "-I", "-B", "-c", SETUP, RUNNER, str(work), str(outcome), str(limits.cpu_s),
                    str(limits.memory_bytes), str(limits.output_bytes), str(limits.processes)]
            child = subprocess.Popen(argv, cwd=work, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                     env=clean_environment(work), start_new_session=True)
            returncode = wait_or_kill(child, limits.wall_s)
        seconds = time.perf_counter() - begin
        network, finished = read_outcome(outcome)
        flooded = output_path.stat().st_size >= limits.output_bytes
        text = output_path.read_bytes()[: 1 << 16].decode("utf-8", errors="replace")
        passed = finished and returncode == 0
        return Outcome(passed, verdict(finished, returncode, text, limits, seconds, flooded), seconds, text, network)
    finally:
        remove(box)


def read_outcome(outcome: Path) -> tuple[str, bool]:
    """(network, finished) from the outcome file: its first line comes from the setup, `finished` from the runner."""
    lines = outcome.read_text(errors="replace").splitlines() if outcome.is_file() else []
    network = lines[0].removeprefix("network: ") if lines else "unknown: the setup did not run"
    return network, lines[1:2] == ["finished"]


def remove(box: Path) -> None:
    """Remove the box, even where the program took the permissions off its own folders (which stops a non-root user)."""
    try:
        shutil.rmtree(box)
    except OSError:
        os.chmod(box, stat.S_IRWXU)
        for folder, names, _ in os.walk(box):
            for name in names:
                os.chmod(os.path.join(folder, name), stat.S_IRWXU, follow_symlinks=False)
        shutil.rmtree(box, ignore_errors=True)


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

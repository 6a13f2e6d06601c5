"""The sandbox (lab/eval/sandbox.py) against hostile programs: each is contained, scored a failure with its reason,
and leaves nothing behind; the next program still runs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from lab.eval.sandbox import Limits, run_sandboxed

FAST = Limits(wall_s=5.0, cpu_s=3, memory_bytes=1 << 30, output_bytes=1 << 16)


def leftovers() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("lab-sandbox-*")}


@pytest.fixture
def clean():
    before = leftovers()
    yield
    assert leftovers() <= before  # the sandbox folder is gone


def test_a_correct_program_passes_and_a_wrong_one_fails_with_its_assertion(clean):
    assert run_sandboxed("def f(x):\n    return x + 1\nassert f(1) == 2\n", FAST).reason == "passed"
    failed = run_sandboxed("def f(x):\n    return x\nassert f(1) == 2, 'f(1) should be 2'\n", FAST)
    assert not failed.passed and failed.reason == "AssertionError: f(1) should be 2"


def test_an_infinite_loop_is_stopped(clean):
    outcome = run_sandboxed("while True:\n    pass\n", FAST)
    assert not outcome.passed and outcome.reason in ("CPU limit (3 s)", "timed out after 5 s (wall)") and outcome.seconds < 8


def test_a_10_gb_allocation_fails_without_touching_the_machine(clean):
    outcome = run_sandboxed("x = bytearray(10 * 1024 ** 3)\n", FAST)
    assert not outcome.passed and outcome.reason == "MemoryError"


def test_a_fork_bomb_is_refused(clean):
    outcome = run_sandboxed("import os\nwhile True:\n    os.fork()\n", FAST)
    assert not outcome.passed and "os.fork is not allowed" in outcome.reason


def test_writing_or_deleting_outside_its_folder_is_refused_and_changes_nothing(clean, tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("keep me")
    os.chmod(tmp_path, 0o777)
    for program in (f"open({str(tmp_path / 'new.txt')!r}, 'w').write('x')\n", f"import os\nos.remove({str(target)!r})\n",
                    f"import shutil\nshutil.rmtree({str(tmp_path)!r})\n", "open('/tmp/lab-sandbox-escape.txt', 'w').write('x')\n"):
        outcome = run_sandboxed(program, FAST)
        assert not outcome.passed and "outside the sandbox folder" in outcome.reason, (program, outcome)
    assert target.read_text() == "keep me" and not (tmp_path / "new.txt").exists() and not Path("/tmp/lab-sandbox-escape.txt").exists()
    assert run_sandboxed("open('inside.txt', 'w').write('fine')\nassert open('inside.txt').read() == 'fine'\n", FAST).passed


def test_environment_secrets_are_not_there(clean, monkeypatch):
    monkeypatch.setenv("LAB_TEST_SECRET", "hunter2")
    outcome = run_sandboxed("import os\nprint(dict(os.environ))\nassert 'LAB_TEST_SECRET' not in os.environ\n", FAST)
    assert outcome.passed and "hunter2" not in outcome.stdout


@pytest.mark.parametrize("exit_call", ["import sys\nsys.exit(0)", "import os\nos._exit(0)", "raise SystemExit"])
def test_exiting_before_the_tests_finish_is_a_failure(clean, exit_call):
    outcome = run_sandboxed(f"{exit_call}\nassert False, 'the tests would fail'\n", FAST)
    assert not outcome.passed and outcome.reason == "exited (code 0) before the tests finished"


def test_an_output_flood_is_cut(clean):
    outcome = run_sandboxed("while True:\n    print('x' * 10000)\n", FAST)
    assert not outcome.passed and outcome.reason == f"output limit ({FAST.output_bytes} bytes)"


def test_no_network(clean):
    outcome = run_sandboxed("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n", FAST)
    assert not outcome.passed and outcome.reason.startswith("PermissionError: sandbox: socket.")


# --- a program cannot talk its way out (issue #70) ---------------------------------------------------------------------

QUICK = Limits(wall_s=2.0, memory_bytes=1 << 30, output_bytes=1 << 16)

ATTEMPT = '''
import os, sys
def attempt(name, action):
    try:
        action()
    except Exception as error:
        print("refused" if str(error).startswith("sandbox:") else "failed", name, "|", type(error).__name__, error, flush=True)
    else:
        print("ESCAPED", name, flush=True)
'''


def box_of(outcome) -> str:
    """The sandbox box a program printed as its first line (`print(os.getcwd())`): its processes carry it in their argv."""
    return os.path.dirname(outcome.stdout.splitlines()[0])


def processes_of(box: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and box.encode() in (entry / "cmdline").read_bytes():
                found.append(entry.name)
        except OSError:
            pass  # it ended while we looked
    return found


FORGERIES = {
    # the verdict's file is named in argv: every way to write it
    "write the outcome": '''
path = sys.argv[2]
attempt("open", lambda: open(path, "a").write("finished\\n"))
attempt("os.open", lambda: os.write(os.open(path, os.O_WRONLY | os.O_APPEND), b"finished\\n"))
attempt("dir_fd", lambda: os.write(os.open("outcome", os.O_WRONLY | os.O_APPEND, dir_fd=os.open("..", os.O_RDONLY)), b"finished\\n"))
attempt("pathlib", lambda: __import__("pathlib").Path(path).write_text("network: isolated\\nfinished\\n"))
open("fake", "w").write("network: isolated\\nfinished\\n")
attempt("rename", lambda: os.rename("fake", path))
attempt("replace", lambda: os.replace("fake", "../outcome"))
attempt("copyfile", lambda: __import__("shutil").copyfile("fake", path))
attempt("symlink", lambda: os.symlink(path, "link"))
attempt("sqlite", lambda: __import__("sqlite3").connect(":memory:").execute(f"ATTACH '{path}' AS o"))
''',
    # no secret in argv, /proc or the environment; whatever is there, written to every fd, does not pass
    "echo what it can read to every fd": '''
found = list(sys.argv) + list(os.environ.values())
for name in ("/proc/self/cmdline", "/proc/self/environ", f"/proc/{os.getppid()}/cmdline", "/dev/fd/../cmdline"):
    attempt(name, lambda: found.append(open(name, "rb").read().decode(errors="replace")))
fds = [int(fd) for fd in os.listdir("/proc/self/fd")] + list(range(64))
for fd in fds:
    for text in found + ["finished"]:
        try:
            os.write(fd, ("\\n" + text + "\\nfinished\\n").encode())
        except OSError:
            pass
''',
    # introspection: the hook through gc, the runner through frames and tracebacks, rebinding what a hook might read
    "introspection": '''
import builtins, gc, inspect, types
def take_the_hook():  # make this frame the one the hook lets write the outcome, then write it
    for thing in gc.get_objects():
        for cell in getattr(thing, "__closure__", None) or ():
            if isinstance(cell.cell_contents, types.FrameType):
                cell.cell_contents = sys._getframe()
    open(sys.argv[2], "a").write("finished\\n")
attempt("gc.get_objects", take_the_hook)
attempt("gc.get_referrers", lambda: gc.get_referrers(sys._getframe()))
def walk(frame):
    while frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            for key in ("outcome", "root", "main_frame", "token"):
                if key in scope:
                    scope[key] = "/" if key == "root" else os.getcwd() + "/fake"
        frame = frame.f_back
walk(sys._getframe())
try:
    raise ValueError
except ValueError as error:  # frames are not hidden: there is nothing in them to take
    walk(error.__traceback__.tb_frame.f_back)
for info in inspect.stack():
    walk(info.frame)
runner = inspect.stack()[-1].frame
attempt("rerun the runner", lambda: exec(runner.f_code, runner.f_globals))
attempt("settrace", lambda: sys.settrace(lambda *a: None))
builtins.len = lambda thing: 0
builtins.type = lambda thing: str
os.path.realpath = lambda path: os.getcwd() + "/fine"
import __main__
__main__.outcome = os.getcwd() + "/fake"
attempt("open after all that", lambda: open(sys.argv[2], "a").write("finished\\n"))
''',
}


@pytest.mark.parametrize("case", list(FORGERIES))
def test_a_program_cannot_forge_a_pass(clean, case):
    outcome = run_sandboxed(ATTEMPT + FORGERIES[case] + "os._exit(0)\n", QUICK)
    assert not outcome.passed and outcome.reason == "exited (code 0) before the tests finished", outcome
    assert "ESCAPED" not in outcome.stdout, outcome.stdout


def test_the_old_forgery_of_echoing_the_token_from_argv_fails(clean):
    """The pass token was sys.argv[7] and its pipe's fd sys.argv[2]: a program wrote one to the other and passed."""
    program = ("import os, sys\nfor word in sys.argv:\n    if len(word) == 32 and set(word) <= set('0123456789abcdef'):\n"
               "        for fd in range(3, 64):\n            try:\n                os.write(fd, word.encode())\n"
               "            except OSError:\n                pass\nos._exit(0)\n")
    outcome = run_sandboxed(program, QUICK)
    assert not outcome.passed and outcome.reason == "exited (code 0) before the tests finished"


def test_file_escapes_through_dir_fd_sqlite_links_and_rebound_names_are_refused(clean, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.chmod(tmp_path, 0o777)
    outside, before = str(tmp_path), sorted(p.name for p in tmp_path.iterdir())
    program = ATTEMPT + f'''
outside = {outside!r}
attempt("a file in a dir_fd outside", lambda: os.open("new.txt", os.O_WRONLY | os.O_CREAT, dir_fd=os.open(outside, os.O_RDONLY)))
attempt("a folder in an O_PATH dir_fd outside", lambda: os.mkdir("newdir", dir_fd=os.open(outside + "/.", os.O_PATH | os.O_DIRECTORY)))
os.makedirs("a/b")
d, up = os.open("a/b", os.O_RDONLY), "../" * 12 + outside.lstrip("/")  # a dir_fd inside, and a path climbing out of it
attempt("os.open dir_fd", lambda: os.open(up + "/new.txt", os.O_WRONLY | os.O_CREAT, dir_fd=d))
attempt("mkdir dir_fd", lambda: os.mkdir(up + "/newdir", dir_fd=d))
attempt("remove dir_fd", lambda: os.remove(up + "/victim.txt", dir_fd=d))
attempt("rename dir_fd", lambda: os.rename(up + "/victim.txt", "moved.txt", src_dir_fd=d, dst_dir_fd=d))
attempt("chmod an fd", lambda: os.chmod(os.open(outside + "/victim.txt", os.O_RDONLY), 0o000))
attempt("sqlite file", lambda: __import__("sqlite3").connect(outside + "/db.sqlite").execute("create table t(x)"))
attempt("sqlite attach", lambda: __import__("sqlite3").connect(":memory:").execute("attach '" + outside + "/db2.sqlite' as x"))
attempt("symlink out", lambda: os.symlink(outside, "out"))
attempt("link in", lambda: os.link(outside + "/victim.txt", "mine.txt"))
attempt("chdir out", lambda: os.chdir(outside))
attempt("relative os.open", lambda: os.open("../../new.txt", os.O_WRONLY | os.O_CREAT))
attempt("mknod a device", lambda: os.mknod("null", 0o666 | __import__("stat").S_IFCHR, os.makedev(1, 3)))  # CAP_MKNOD dropped
import __main__, builtins
__main__.root, __main__.REFUSED, __main__.PATHS = "/", (), ()
os.path.realpath = lambda path: os.getcwd() + "/x"
builtins.isinstance = lambda *a: True
attempt("open after rebinding", lambda: open(outside + "/new.txt", "w").write("x"))
attempt("remove after rebinding", lambda: os.remove(outside + "/victim.txt"))
raise SystemExit("done")
'''
    outcome = run_sandboxed(program, QUICK)
    assert not outcome.passed and "ESCAPED" not in outcome.stdout, outcome.stdout
    assert outcome.stdout.count("refused") == 15, outcome.stdout
    assert outcome.stdout.count("'..' in a path that may be relative to a dir_fd") == 5  # beside the resolved-path check
    assert sorted(p.name for p in tmp_path.iterdir()) == before and victim.read_text() == "keep me"
    assert victim.stat().st_mode & 0o777


def test_inside_its_folder_a_program_works_as_usual(clean):
    """What the refusals must not break: files and folders inside, shutil.rmtree (dir_fd inside), tempfile, threads, typing."""
    program = """
import os, shutil, tempfile, threading, typing, collections, logging, pathlib
T, Point = typing.TypeVar("T"), collections.namedtuple("Point", "x y")
os.makedirs("a/b/c")
pathlib.Path("a/b/c/f.txt").write_text("x")
os.rename("a", "z")
shutil.rmtree("z")
with tempfile.TemporaryDirectory() as folder, tempfile.NamedTemporaryFile() as handle:
    handle.write(b"x")
    open(os.path.join(folder, "g"), "w").write("y")
thread = threading.Thread(target=logging.getLogger().warning, args=("from a thread",))
thread.start()
thread.join()
assert sorted(os.listdir(".")) == ["program.py"], os.listdir(".")
"""
    outcome = run_sandboxed(program, QUICK)
    assert outcome.passed, outcome


def test_new_processes_are_refused_whatever_the_api_and_none_is_left(clean):
    program = "import os\nprint(os.getcwd(), flush=True)\n" + ATTEMPT + '''
import time
def child(pid):
    if pid == 0:
        time.sleep(60)
        os._exit(0)
attempt("os.fork", lambda: child(os.fork()))
attempt("os.forkpty", lambda: child(os.forkpty()[0]))
attempt("pty.fork", lambda: child(__import__("pty").fork()[0]))
attempt("os.posix_spawn", lambda: os.posix_spawn("/bin/sleep", ["sleep", "60"], {}))
attempt("os.spawnv", lambda: os.spawnv(os.P_NOWAIT, "/bin/sleep", ["sleep", "60"]))
attempt("os.system", lambda: os.system("sleep 60 &"))
attempt("subprocess", lambda: __import__("subprocess").Popen(["sleep", "60"]))
attempt("_posixsubprocess", lambda: __import__("_posixsubprocess"))
import _imp, importlib.util
attempt("_imp.create_dynamic", lambda: _imp.create_dynamic(importlib.util.find_spec("_posixsubprocess")))
import multiprocessing
attempt("multiprocessing", lambda: multiprocessing.Process(target=time.sleep, args=(60,)).start())
attempt("os.execv", lambda: os.execv("/bin/sleep", ["sleep", "60"]))
raise SystemExit("done")
'''
    outcome = run_sandboxed(program, QUICK)
    assert not outcome.passed and "ESCAPED" not in outcome.stdout, outcome.stdout
    assert outcome.stdout.count("refused") == 11, outcome.stdout
    assert processes_of(box_of(outcome)) == []


def test_no_network_whatever_the_api_and_the_outcome_says_whether_it_was_isolated(clean):
    program = ATTEMPT + '''
import socket
attempt("create_connection", lambda: socket.create_connection(("127.0.0.1", 9), timeout=1))
attempt("udp sendmsg", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendmsg([b"x"], [], 0, ("8.8.8.8", 53)))
attempt("socketpair", lambda: socket.socketpair())
attempt("getaddrinfo", lambda: socket.getaddrinfo("example.com", 80))
attempt("fromfd", lambda: socket.fromfd(1, socket.AF_INET, socket.SOCK_STREAM))
raise SystemExit("done")
'''
    outcome = run_sandboxed(program, QUICK)
    assert not outcome.passed and "ESCAPED" not in outcome.stdout and outcome.stdout.count("refused") == 5, outcome.stdout
    assert outcome.network == "isolated" or outcome.network.startswith("shared: "), outcome.network
    if os.geteuid() == 0 and os.system("unshare -n true 2>/dev/null") == 0:  # this machine allows a network namespace
        assert outcome.network == "isolated"


@pytest.mark.parametrize("sleep", ["import time\ntime.sleep(60)", "import threading\nthreading.Event().wait()",
                                   "import signal\nsignal.pause()", "import select\nselect.select([], [], [])"])
def test_a_program_that_sleeps_is_killed_at_the_wall_limit_and_leaves_no_process(clean, sleep):
    outcome = run_sandboxed(f"import os\nprint(os.getcwd(), flush=True)\n{sleep}\n", Limits(wall_s=1.0))
    assert not outcome.passed and outcome.reason == "timed out after 1 s (wall)" and outcome.seconds < 4, outcome
    assert processes_of(box_of(outcome)) == []


def test_the_cpu_limit_follows_the_wall_limit():
    assert Limits(wall_s=1.0).cpu_s == 1 and Limits(wall_s=12.5).cpu_s == 13 and Limits().cpu_s == 10
    assert Limits(wall_s=30, cpu_s=5).cpu_s == 5


def test_the_hook_reads_no_global_or_builtin_name():
    """What the hook uses is bound when it is installed: a program that rebinds a module's or builtins' names changes nothing."""
    import dis

    from lab.eval.sandbox import guard

    hook = guard("/work", "/outcome", None)
    assert [i.argval for i in dis.get_instructions(hook) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")] == []
    assert all(not isinstance(c.cell_contents, (list, dict, set)) for c in hook.__closure__)  # nothing mutable to reach

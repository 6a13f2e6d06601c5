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

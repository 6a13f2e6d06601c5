"""The real `lab-train` CLI for tests: its scaled-down config, and the one way tests start commands —
one environment (`cli_env`), one timeout (`SUBPROCESS_TIMEOUT`), run to the end (`lab_train`,
`run_module`) or started, waited on and killed (`start_lab_train`, `wait_for`, `kill_session`), or
the console entry in this process for bad input refused before training (`lab_train_in_process`)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

# Every subprocess a test starts gets this long: a correct program on a busy machine (CI shares its
# 2 cores; a run measured at 52 s alone took over 120 s at load 10) must not fail on time. A hang
# is still caught, by pytest-timeout (pyproject.toml), after longer.
SUBPROCESS_TIMEOUT = 1500
REPO = Path(__file__).resolve().parents[1]

TINY = [
    "model.d_model=32",
    "model.n_layers=6",  # compute_match=blocks: K=4 block heads still leave 2 trunk blocks
    "model.n_heads=2",
    "data.max_docs=20",
    "data.seq_len=32",
    "data.batch_size=4",
    "data.max_val_rows=16",
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "trainer.log_every_n_steps=1",
    "optim.warmup_steps=2",
    "trainer.enable_progress_bar=false",
]
# The end-of-run decoding evaluation sized without a time budget: a budgeted plan is sized from measured
# time, so two runs of one config may decode different amounts. Tests comparing two runs pin it.
FIXED_DECODING = ["callbacks.decoding.budget_s=null", "callbacks.decoding.prompts=2", "callbacks.decoding.new_tokens=16",
                  "callbacks.decoding.repeats=1"]


def cli_env(cache_dir: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment every command a test starts runs in: this process's, with offline wandb,
    Hydra's one-line errors, this checkout first on the import path (a run imports the tests' own
    callbacks), the dataset cache when given, and `extra` last."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")]))
    cache = {} if cache_dir is None else {"MTP_LAB_CACHE": str(cache_dir)}
    return {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0", "PYTHONPATH": path, **cache, **extra}


def lab_train(*overrides: str, cache_dir: Path, cwd: Path, env: dict[str, str] | None = None, prefix: tuple[str, ...] = (),
              timeout: int = SUBPROCESS_TIMEOUT, **popen) -> subprocess.CompletedProcess:
    """`lab-train OVERRIDES` run to its end (`prefix`: a wrapper command; `env`: variables over `cli_env`'s)."""
    return run_module("lab.train", *overrides, cache_dir=cache_dir, cwd=cwd, env=env, prefix=prefix, timeout=timeout, **popen)


def run_module(module: str, *args: str, cache_dir: Path | None, cwd: Path, env: dict[str, str] | None = None,
               prefix: tuple[str, ...] = (), timeout: int = SUBPROCESS_TIMEOUT, **popen) -> subprocess.CompletedProcess:
    """`python -m MODULE ARGS` run to its end, output captured as text."""
    return subprocess.run([*prefix, sys.executable, "-m", module, *args], cwd=cwd, env=cli_env(cache_dir, **(env or {})),
                          capture_output=True, text=True, timeout=timeout, **popen)


def start_lab_train(*overrides: str, cache_dir: Path, cwd: Path, env: dict[str, str] | None = None,
                    stdout=subprocess.DEVNULL) -> subprocess.Popen:
    """`lab-train OVERRIDES` started in its own session, so that `kill_session` reaches every process
    it starts (a sweep's jobs, Lightning's ranks); stderr is piped for the failure message."""
    return subprocess.Popen([sys.executable, "-m", "lab.train", *overrides], cwd=cwd, env=cli_env(cache_dir, **(env or {})),
                            stdout=stdout, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(path: Path, process: subprocess.Popen, what: str, timeout: float = SUBPROCESS_TIMEOUT) -> None:
    """Poll until `path` exists while `process` runs; fail with its stderr if it ends first, or with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, f"the process ended before {what}: {process.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"never {what} in {timeout:.0f} s"
        time.sleep(0.2)


def kill_session(process: subprocess.Popen) -> int:
    """SIGKILL every process of `process`'s session (started by `start_lab_train`) and reap it: its exit status."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.wait(timeout=60)


def lab_train_in_process(*overrides: str, cache_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`lab-train OVERRIDES` through its console entry (real Hydra) in this process: `command_in_process`."""
    return command_in_process("lab-train", *overrides, cwd=cwd, cache_dir=cache_dir)


def command_in_process(command: str, *args: str, cwd: Path | None = None, cache_dir: Path | None = None) -> subprocess.CompletedProcess:
    """A console script (`lab-train`, `lab-report`, `lab-export`, ...) through the entry point its package
    declares, in this process: for input it refuses before any work, without a new interpreter's start
    (10-20 s of imports on a busy machine). Exit code, stdout and stderr come back as a real run's do.

    What only a real process shows (a library warning printed on stderr, an import-time failure)
    stays covered by at least one real-process case per kind of refusal."""
    (entry,) = entry_points(group="console_scripts", name=command)
    return in_process(entry.load(), [command, *args], cwd=cwd or Path.cwd(), env=cli_env(cache_dir))


def in_process(entry: Callable[[], object], argv: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Call a console entry (`entry()`, reading `sys.argv`) as its command would run, in this process: in
    `cwd`, with `env` as the environment, output captured, `SystemExit` as the exit code. The working
    directory, environment, argv, Hydra's global state and the root logger are restored afterwards."""
    from hydra.core.global_hydra import GlobalHydra

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_cwd = dict(os.environ), sys.argv, Path.cwd()
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    code = 0
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = list(argv)
        GlobalHydra.instance().clear()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            entry()
    except SystemExit as stop:  # what the interpreter does with it: an int is the status, anything else is printed
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if not isinstance(stop.code, (int, type(None))):
            err.write(f"{stop.code}\n")
    finally:
        GlobalHydra.instance().clear()
        for handler in root.handlers:
            if handler not in saved_handlers:
                handler.close()
        root.handlers[:], root.level = saved_handlers, saved_level
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(list(argv), code, out.getvalue(), err.getvalue())


def runner(overrides: list[str], in_a_process: set[str]):
    """`lab_train` when one of `overrides` is in `in_a_process` (the cases kept as real processes), else `lab_train_in_process`."""
    return lab_train if in_a_process.intersection(overrides) else lab_train_in_process


def lab_report(*args: str, prelude: str = "") -> subprocess.CompletedProcess:
    """`lab-report ARGS` as a real process; `prelude`: Python run before the entry (e.g. hiding an optional package)."""
    code = f"import sys; {prelude}from lab.report.cli import main; main(sys.argv[1:])"
    return subprocess.run([sys.executable, "-c", code, *args], env=cli_env(), capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The one `error: ...` line of a command that refused its input: exit 2, nothing else on stderr, no traceback."""
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def read_run(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


def wandb_history_keys(run_dir: Path) -> tuple[set, list]:
    """Metric names in the offline wandb run, read back with wandb's own `leet inspect`."""
    runs = sorted(Path(run_dir, "wandb").glob("offline-run-*"))
    assert runs, f"no offline wandb run under {run_dir}"
    out = subprocess.run(["wandb", "leet", "inspect", "--json", str(runs[-1])], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    keys, records = set(), [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    for record in records:
        if record.get("type") == "history":
            keys |= set(history_items(record))
    return keys, records


def history_items(record: dict) -> dict:
    return record.get("history", {}).get("item", {})


def wandb_config(run_dir: Path) -> dict:
    """The offline wandb run's config as wandb's own reader (`wandb leet inspect`) gives it, flattened
    with dots the way wandb's UI names the keys (`data.seq_len`)."""
    _, records = wandb_history_keys(run_dir)
    merged: dict = {}
    for record in records:
        if record.get("type") == "config":
            merged.update(record["config"].get("update", {}))
    return flatten(merged)


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out

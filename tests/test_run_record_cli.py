"""run.json across attempts, file modes, and faults, through the real `lab-train` CLI.

Permission faults need a process that the file modes stop: as root (which ignores them) the
command runs in a user namespace mapped onto a non-root uid (`unshare --user`). The full
disk is a real 64 KiB tmpfs mounted in a private mount namespace (`unshare --mount`), where
the checkpoint folder lives.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from lab.tracking.timing import MACHINE_STATE_NAME
from tests.cli import FIXED_DECODING, SUBPROCESS_TIMEOUT, TINY, kill_session, lab_train, read_run, start_lab_train


def run_cli(*overrides: str, cache_dir: Path, cwd: Path, prefix: tuple[str, ...] = (), umask: int | None = None) -> subprocess.CompletedProcess:
    return lab_train(*overrides, cache_dir=cache_dir, cwd=cwd, prefix=prefix, preexec_fn=None if umask is None else (lambda: os.umask(umask)))


def unshare_works(*flags: str) -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", *flags, "true"], capture_output=True).returncode == 0


AS_USER = ("unshare", "--user", "--map-user=1000", "--map-group=1000")


def unprivileged() -> tuple[str, ...]:
    """A command prefix under which file modes apply (empty when not root)."""
    if os.geteuid() != 0:
        return ()
    if not unshare_works(*AS_USER[1:]):
        pytest.skip("running as root without user namespaces: file modes cannot be tested")
    return AS_USER


def last_error_line(out: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return out.stderr.strip().splitlines()[-1]


@pytest.mark.slow  # 25–45 s alone (tests/README.md)
def test_resumes_append_attempts_and_never_erase_results(tmp_path, cache_dir):
    run = tmp_path / "run"
    job = [*TINY, "callbacks.checkpoint.every_n_train_steps=3", f"hydra.run.dir={run}"]
    first = run_cli(*job, cache_dir=cache_dir, cwd=tmp_path, umask=0o027)
    assert first.returncode == 0, first.stderr[-3000:]
    record = read_run(run)
    overrides = (run / ".hydra" / "overrides.yaml").read_text()
    metrics = (run / "metrics.csv").read_bytes()

    # Umask 027: every run file, checkpoints included, is 0640 (a temp-file write would make it 0600).
    for path in (run / "checkpoints" / "last.ckpt", run / "run.json", run / "metrics.csv"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path

    refused = run_cli(*job, "ckpt_path=last", "head=linear", "head.k=2", cache_dir=cache_dir, cwd=tmp_path)
    assert refused.returncode == 2
    # the resume's config is compared with the run's recorded one first (issue 56), before any checkpoint is read
    assert last_error_line(refused).startswith("error: head.k: the run being resumed trained with 1, this resume gives 2; ")
    again = run_cli(*job, "ckpt_path=last", cache_dir=cache_dir, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to do" in again.stderr, again.stderr[-2000:]

    after = read_run(run)
    for key in ("status", "error", "final_metrics", "run_time_s", "overrides", "config", "manifest", "started_at"):
        assert after[key] == record[key], key
    assert [a["status"] for a in after["attempts"]] == ["ok", "refused", "nothing_to_do"]
    assert after["attempts"][0] == record["attempts"][0]
    assert after["attempts"][1]["error"].startswith("config error: head.k: the run being resumed trained with 1, this resume gives 2; ")
    assert after["attempts"][1]["overrides"][-3:] == ["ckpt_path=last", "head=linear", "head.k=2"]
    assert after["attempts"][2]["resumed_from_step"] is None and "finished at step 6" in after["attempts"][2]["note"]
    assert (run / ".hydra" / "overrides.yaml").read_text() == overrides
    assert "ckpt_path=last" not in yaml.safe_load(overrides)
    assert (run / "metrics.csv").read_bytes() == metrics


@pytest.mark.slow  # 25–45 s alone (tests/README.md)
def test_longer_resume_sums_run_time_and_keeps_the_first_attempts_results(tmp_path, cache_dir):
    run = tmp_path / "run"
    tiny = [o for o in TINY if not o.startswith("trainer.max_steps")]
    job = [*tiny, "callbacks.checkpoint.every_n_train_steps=3", f"hydra.run.dir={run}"]
    assert run_cli(*job, "trainer.max_steps=6", cache_dir=cache_dir, cwd=tmp_path).returncode == 0
    first = read_run(run)
    out = run_cli(*job, "trainer.max_steps=9", "ckpt_path=last", cache_dir=cache_dir, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    record = read_run(run)
    one, two = record["attempts"]
    assert (one["status"], two["status"], two["resumed_from_step"]) == ("ok", "ok", 6)
    assert one["final_metrics"] == first["final_metrics"] and record["final_metrics"] == two["final_metrics"]
    durations = [a["ended_at"] - a["started_at"] for a in (one, two)]
    assert record["run_time_s"] == pytest.approx(sum(durations)) and record["run_time_s"] > first["run_time_s"]


@pytest.mark.slow  # one training run (25–45 s alone)
def test_a_finished_run_is_never_trained_over_by_another_config(tmp_path, cache_dir):
    """Issue 38: `optim.lr=0.001 hydra.run.dir=<finished run>` retrained from step 0 over it, its record kept the first overrides."""
    run = tmp_path / "run"
    assert run_cli(*TINY, f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path).returncode == 0
    record = read_run(run)
    assert record["attempts"][0]["step"] == 6  # the step the finished attempt reached, not a stale heartbeat's
    files = [run / "run.json", run / "metrics.csv", run / "checkpoints" / "last.ckpt", run / ".hydra" / "overrides.yaml", run / ".hydra" / "config.yaml"]
    before = {path: path.read_bytes() for path in files}
    out = run_cli(*TINY, "optim.lr=0.001", f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]
    assert last_error_line(out) == (f"error: hydra.run.dir: {run} holds a finished run (run.json: ok); it is never overwritten: "
                                    "choose another hydra.run.dir, or continue it with its own overrides and ckpt_path=last")
    assert {path: path.read_bytes() for path in files} == before


def test_export_honours_the_umask(tmp_path, cache_dir):
    from lab.release.export import export

    run = tmp_path / "run"
    assert run_cli(*TINY, f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path).returncode == 0
    previous = os.umask(0o027)
    try:
        export(run / "checkpoints" / "last.ckpt", tmp_path / "release")
    finally:
        os.umask(previous)
    files = sorted((tmp_path / "release").iterdir())
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o640 for p in files), [(p.name, oct(p.stat().st_mode)) for p in files]


# ---- faults ------------------------------------------------------------------------------


def test_unreadable_corpus_is_one_line_and_no_folder(tmp_path, cache_dir):
    prefix = unprivileged()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"doc {i}\n" for i in range(40)))
    corpus.chmod(0)
    run = tmp_path / "run"
    out = run_cli(*TINY, "data=text", f"data.path={corpus}", "data.max_docs=null", f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path, prefix=prefix)
    assert out.returncode == 2
    assert last_error_line(out) == f"error: data.path: cannot read {corpus}: permission denied"
    assert not run.exists()  # a refused first attempt leaves no folder (issue 26)


def test_unwritable_cache_dir_is_one_line(tmp_path):
    prefix = unprivileged()
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o555)
    cache.chmod(0o555)
    run = tmp_path / "run"
    out = run_cli(*TINY, f"hydra.run.dir={run}", cache_dir=cache, cwd=tmp_path, prefix=prefix)
    assert out.returncode == 2
    assert last_error_line(out).startswith(f"error: data.cache_dir: cannot write {cache}") and out.stderr.strip().endswith("permission denied")
    assert not run.exists()  # a refused first attempt leaves no folder (issue 26)


@pytest.mark.parametrize("existing", [True, False], ids=["read-only run dir", "unwritable output dir"])
def test_unwritable_run_dir_is_one_line(tmp_path, cache_dir, existing):
    prefix = unprivileged()
    parent = tmp_path / "outputs"
    parent.mkdir()
    run = parent / "run"
    if existing:
        run.mkdir()
        run.chmod(0o555)
    else:
        parent.chmod(0o555)
    out = run_cli(*TINY, f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path, prefix=prefix)
    assert out.returncode == 2
    line = last_error_line(out)
    assert line.startswith("error: hydra.run.dir: cannot write ") and line.endswith(": permission denied"), line
    assert str(parent) in line and not (run / "run.json").exists()


def test_full_disk_mid_run_is_one_line_exit_1_and_a_failed_record(tmp_path, cache_dir):
    if os.geteuid() != 0 or not unshare_works("--mount"):
        pytest.skip("needs a private mount namespace to mount a small tmpfs")
    run, full = tmp_path / "run", tmp_path / "full"
    full.mkdir()
    overrides = [*TINY, "callbacks.checkpoint.every_n_train_steps=3", f"callbacks.checkpoint.dirpath={full}", f"hydra.run.dir={run}"]
    in_tmpfs = ("unshare", "--mount", "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$0" && exec "$@"', str(full))
    out = run_cli(*overrides, cache_dir=cache_dir, cwd=tmp_path, prefix=in_tmpfs)
    assert out.returncode == 1, out.stderr[-3000:]
    line = last_error_line(out)
    assert line.startswith(f"error: checkpoint: cannot write {full}/") and line.endswith(": no space left on device"), line
    record = read_run(run)
    assert record["status"] == "failed" and record["error"] == line.removeprefix("error: ")
    assert json.loads((run / "run.json").read_text())["attempts"][0]["status"] == "failed"


def test_online_wandb_without_a_network_is_refused_in_one_line_before_anything_trains(tmp_path, cache_dir):
    """Issue 38: wandb retried for 2 minutes, then a 36-line traceback. The server here: a closed port on this machine."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]  # free once the socket closes: nothing listens there
    run = tmp_path / "run"
    online = {"WANDB_MODE": "online", "WANDB_BASE_URL": f"http://127.0.0.1:{closed}", "WANDB_API_KEY": "x" * 40}
    out = lab_train(*TINY, f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path, env=online)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]
    assert last_error_line(out) == (f"error: logger.wandb.mode: online, but http://127.0.0.1:{closed} cannot be reached (connection refused); "
                                    "run with WANDB_MODE=offline (and `wandb sync` the run later) or fix the network")
    assert not run.exists()


def test_an_unwritable_wandb_folder_in_an_existing_run_dir_is_one_line_naming_it_and_leaves_nothing(tmp_path, cache_dir):
    """Issue 38: the path came out lower-cased or as '(unknown path)', and .hydra/, run.json and .lock stayed."""
    prefix = unprivileged()
    run = tmp_path / "Run"  # capitals: the line must keep the path as it is
    (run / "wandb").mkdir(parents=True)
    (run / "wandb").chmod(0o555)
    out = run_cli(*TINY, "logger=wandb", f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path, prefix=prefix)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]
    assert last_error_line(out) == f"error: logger.wandb.save_dir: cannot write {run}/wandb: permission denied"
    assert sorted(p.name for p in run.iterdir()) == ["wandb"]


@pytest.mark.parametrize("filler", ["", "count=12"], ids=["no byte free", "16 KiB free"])
def test_a_full_disk_before_the_first_write_is_one_line_and_leaves_nothing(tmp_path, cache_dir, filler):
    """Issue 38: Hydra's config save ended in a 9-line traceback, an empty .hydra/config.yaml, .lock and train.log.
    Issue 56: with 16 KiB free the write probe's os.write took part of its bytes without an error."""
    if os.geteuid() != 0 or not unshare_works("--mount"):
        pytest.skip("needs a private mount namespace to mount a small tmpfs")
    full = tmp_path / "full"
    full.mkdir()
    # The tmpfs lives as long as the namespace: what is left in it is listed from inside, after lab-train ends.
    fill_run_list = (f'mount -t tmpfs -o size=64k tmpfs "$0" && {{ dd if=/dev/zero of="$0/filler" bs=4k {filler} 2>/dev/null; '
                     '"$@"; code=$?; echo "left: $(ls -A "$0" | tr "\\n" " ")"; exit $code; }')
    out = run_cli(*TINY, f"hydra.run.dir={full}/run", cache_dir=cache_dir, cwd=tmp_path, prefix=("unshare", "--mount", "sh", "-c", fill_run_list, str(full)))
    assert out.returncode == 2, out.stderr[-3000:]
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]
    line = last_error_line(out)
    assert line.startswith(f"error: hydra.run.dir: cannot write {full}") and line.endswith(": no space left on device"), line
    assert out.stdout.strip().splitlines()[-1].strip() == "left: filler", out.stdout[-2000:]


# ---- kills at the records' weak points ------------------------------------------------------


def kill_env(point: str, run_dir: Path) -> dict:
    return {"MTP_LAB_KILL_AT": point, "MTP_LAB_KILL_DIR": run_dir.name}


@pytest.mark.slow  # ~90 s / ~45 s alone; the chaos and signal tests (slow too) kill and resume the same way
def test_kills_during_a_validation_and_a_checkpoint_write_lose_no_row_and_leave_no_temp_file(tmp_path, cache_dir):
    """Checkpoints and validations after steps 2, 4, 6: each checkpoint waits for its validation's rows."""
    tiny = [o for o in TINY if not o.startswith(("trainer.max_steps", "trainer.val_check_interval"))]
    job = [*tiny, *FIXED_DECODING, "trainer.max_steps=6", "trainer.val_check_interval=2", "callbacks.checkpoint.every_n_train_steps=2",
           "+callbacks.chaos._target_=tests.chaos_hooks.KillAt"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    a = start_lab_train(*job, f"hydra.run.dir={whole}", cache_dir=cache_dir, cwd=tmp_path)
    try:
        for point, resumed_from in (("validation@4", None), ("checkpoint_write@6", 2)):
            extra = [] if resumed_from is None else ["ckpt_path=last"]
            out = lab_train(*job, *extra, f"hydra.run.dir={killed}", cache_dir=cache_dir, cwd=tmp_path, env=kill_env(point, killed))
            assert out.returncode == -9, (point, out.stderr[-3000:])
        assert list((killed / "checkpoints").glob(".*.partial")), "the kill must leave an orphaned temp file"
        out = run_cli(*job, "ckpt_path=last", f"hydra.run.dir={killed}", cache_dir=cache_dir, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        assert a.wait(timeout=SUBPROCESS_TIMEOUT) == 0, a.stderr.read()[-3000:]
    finally:
        kill_session(a)

    def rows(run_dir: Path) -> list[dict]:
        return [{k: v for k, v in r.items() if not MACHINE_STATE_NAME.search(k)} for r in csv.DictReader((run_dir / "metrics.csv").open())]

    assert rows(killed) == rows(whole)
    assert [r["step"] for r in rows(whole) if r.get("val/loss")] == ["1", "3", "5"]  # validations after steps 2, 4 and 6
    assert not [p.name for p in (killed / "checkpoints").iterdir() if p.name != "last.ckpt"]
    record = read_run(killed)
    assert [(a["status"], a["resumed_from_step"]) for a in record["attempts"]] == [("interrupted", None), ("interrupted", 2), ("ok", 4)]
    untimed = lambda metrics: {k: v for k, v in metrics.items() if not MACHINE_STATE_NAME.search(k)}  # noqa: E731
    assert untimed(record["final_metrics"]) == untimed(read_run(whole)["final_metrics"])


def serve(status: int, body: bytes, content_type: str):
    """A local HTTP server answering every request with `status` and `body` (a daemon thread); its base URL."""
    import http.server
    import threading

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_online_wandb_against_a_server_that_is_not_wandb_is_refused_like_no_network(tmp_path, cache_dir):
    """Issue 56: an endpoint that answers but is not wandb (an intercepting proxy's 404 in 4 ms) passed the probe;
    then a 35-line traceback, rc 1 and a run folder left behind."""
    import time

    server, url = serve(404, b"<html><body>Not Found</body></html>", "text/html")
    try:
        run = tmp_path / "run"
        online = {"WANDB_MODE": "online", "WANDB_BASE_URL": url, "WANDB_API_KEY": "x" * 40}
        started = time.monotonic()
        out = lab_train(*TINY, f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path, env=online)
    finally:
        server.shutdown()
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr[-3000:]
    assert last_error_line(out) == (f"error: logger.wandb.mode: online, but {url} does not answer as a wandb server (HTTP 404 to "
                                    "POST /graphql, not JSON); run with WANDB_MODE=offline (and `wandb sync` the run later) or fix the network")
    assert not run.exists() and time.monotonic() - started < 120


def test_the_probe_accepts_a_json_answer_and_gives_up_on_a_silent_server_within_its_bound():
    """A wandb server answers an unauthenticated query with JSON (401 here); a server that never answers is
    'no answer' once the bound has passed, however the time goes (name resolution included)."""
    import socket
    import time

    from lab.tracking import wandb_reach

    server, url = serve(401, b'{"errors": [{"message": "unauthorized"}]}', "application/json")
    try:
        assert wandb_reach.wandb_answer_problem(url) is None
    finally:
        server.shutdown()
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        started = time.monotonic()
        problem = wandb_reach.bounded(lambda: wandb_reach.wandb_answer_problem(f"http://127.0.0.1:{silent.getsockname()[1]}"), 1.0)
        assert problem == "cannot be reached (no answer within 1 s)" and time.monotonic() - started < 3


@pytest.mark.slow  # 25–50 s of one worker (tests/README.md)
def test_a_resume_that_would_train_differently_is_refused_naming_the_setting_and_a_longer_one_goes_on(tmp_path, cache_dir):
    """Issue 56: resuming with another optim.lr trained on at it, and run.json showed the new rate for the steps
    already taken. The refused attempt leaves the run's record and checkpoint as they were."""
    run = tmp_path / "run"
    base = [*[o for o in TINY if not o.startswith("trainer.max_steps")], "callbacks.decoding.prompts=0", f"hydra.run.dir={run}"]
    assert lab_train(*base, "trainer.max_steps=2", cache_dir=cache_dir, cwd=tmp_path).returncode == 0
    checkpoint = (run / "checkpoints" / "last.ckpt").read_bytes()
    out = lab_train(*base, "trainer.max_steps=4", "ckpt_path=last", "optim.lr=0.01", cache_dir=cache_dir, cwd=tmp_path)
    assert out.returncode == 2 and last_error_line(out).startswith(
        "error: optim.lr: the run being resumed trained with 0.003, this resume gives 0.01; a resume continues the run as it was"), out.stderr[-3000:]
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == checkpoint
    record = read_run(run)
    assert record["status"] == "ok" and record["config"]["optim"]["lr"] == 0.003
    out = lab_train(*base, "trainer.max_steps=4", "ckpt_path=last", "trainer.log_every_n_steps=2", cache_dir=cache_dir, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert [a["status"] for a in read_run(run)["attempts"]] == ["ok", "refused", "ok"] and read_run(run)["attempts"][-1]["step"] == 4

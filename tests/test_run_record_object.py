"""RunRecord on its own: attempts, interrupted attempts, run time, records written before attempts existed."""

import json

import pytest

from lab.run.record import RunRecord, read_run_json


def write(run_dir, payload):
    (run_dir / "run.json").write_text(json.dumps(payload))


def test_a_killed_attempt_becomes_interrupted_and_counts_up_to_its_heartbeat(tmp_path):
    write(tmp_path, {
        "status": "running", "overrides": ["seed=1"], "final_metrics": {}, "started_at": 100.0,
        "attempts": [{"attempt": 1, "started_at": 100.0, "ended_at": None, "heartbeat_at": 130.0, "status": "running", "overrides": ["seed=1"]}],
    })
    record = RunRecord(tmp_path, ["seed=1", "ckpt_path=last"])
    record.start("ckpt", 4)
    on_disk = json.loads((tmp_path / "run.json").read_text())
    first, second = on_disk["attempts"]
    assert (first["status"], first["ended_at"]) == ("interrupted", 130.0)
    assert (second["status"], second["resumed_from_step"], second["attempt"]) == ("running", 4, 2)
    assert on_disk["overrides"] == ["seed=1"] and on_disk["started_at"] == 100.0
    record.attempt["started_at"] = 200.0  # a fixed clock for the sum below
    record.finish("ok", metrics={"val/loss": 2.5})
    done = json.loads((tmp_path / "run.json").read_text())
    assert done["status"] == "ok" and done["final_metrics"] == {"val/loss": 2.5}
    assert done["run_time_s"] == pytest.approx(30.0 + (done["attempts"][1]["ended_at"] - 200.0))


def test_refused_and_nothing_to_do_attempts_change_only_the_attempt_list(tmp_path):
    previous = {"status": "ok", "error": None, "overrides": ["seed=0"], "final_metrics": {"val/loss": 1.0}, "run_time_s": 42.0,
                "started_at": 10.0, "config": {"seed": 0}}
    write(tmp_path, previous)  # written before attempts were recorded
    RunRecord(tmp_path, ["seed=0", "ckpt_path=last", "head=linear"]).refuse("config error: checkpoint: head.name differs")
    RunRecord(tmp_path, ["seed=0", "ckpt_path=last"]).nothing_to_do("the run finished at step 6")
    after = json.loads((tmp_path / "run.json").read_text())
    assert {k: after[k] for k in previous} == previous
    legacy, refused, noop = after["attempts"]
    assert (legacy["status"], legacy["ended_at"], legacy["final_metrics"]) == ("ok", 52.0, {"val/loss": 1.0})
    assert (refused["status"], refused["error"]) == ("refused", "config error: checkpoint: head.name differs")
    assert (noop["status"], noop["error"], noop["note"]) == ("nothing_to_do", None, "the run finished at step 6")


def test_a_refused_first_attempt_is_a_failed_record(tmp_path):
    record = RunRecord(tmp_path, ["head.k=99"])
    record.update(config={"seed": 0})
    record.refuse("config error: head.k: too large")
    on_disk = json.loads((tmp_path / "run.json").read_text())
    assert (on_disk["status"], on_disk["error"], on_disk["run_time_s"]) == ("failed", "config error: head.k: too large", 0.0)
    assert [a["status"] for a in on_disk["attempts"]] == ["refused"] and on_disk["config"] == {"seed": 0}


def test_an_unreadable_record_is_kept_aside_not_lost(tmp_path):
    (tmp_path / "run.json").write_text("{half a record")
    assert read_run_json(tmp_path / "run.json") is None
    kept = list(tmp_path.glob("run.json.unreadable-*"))
    assert len(kept) == 1 and kept[0].read_text() == "{half a record"

"""End-to-end runs through the real `lab-train` CLI (Hydra + Lightning + CSV + offline wandb)."""

import csv
import json

import pytest
import torch

from lab.model.heads import report_traits
from tests.cli import TINY, lab_train, lab_train_in_process, read_run, wandb_config, wandb_history_keys


def test_tiny_run_writes_metrics_checkpoint_record_and_wandb(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    result = lab_train(*TINY, f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert len(losses) == 6 and all(loss > 0 for loss in losses)
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    record = read_run(run_dir)
    assert record["status"] == "ok" and record["error"] is None
    assert len(record["manifest"]["corpus_fingerprint"]) == 64
    assert record["manifest"]["tokenizer"]["kind"] == "byte"
    assert record["versions"]["torch"] and "val/loss" in record["final_metrics"]
    assert (record["cost"]["blocks_trunk"], record["cost"]["blocks_head"]) == (6, 0)
    assert "6 trunk + 0 head = 6" in result.stdout
    keys, records = wandb_history_keys(run_dir)
    assert "train/loss" in keys and "val/bpb" in keys
    run = next(r for r in records if r.get("type") == "run")["run"]
    assert run["job_type"] == "ntp" and run["project"] == "mtp-lab"
    # What lab-report reads of the head, in run.json and in the wandb run config: the registry's traits and the resolved K.
    assert record["k"] == 1 and record["head_traits"] == report_traits("ntp") == {"baseline": True, "teacher_forced": False, "display_rank": 0}
    config = wandb_config(run_dir)
    assert config["k"] == 1 and {name: config[f"head_traits.{name}"] for name in record["head_traits"]} == record["head_traits"]


@pytest.mark.slow  # 25–45 s alone (tests/README.md)
def test_every_head_trains_end_to_end_in_one_multirun(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = lab_train(
        "-m", *TINY, "head=linear,parallel,causal,anticausal", "head.k=4", "model.n_layers=5",
        f"hydra.sweep.dir={sweep}", cache_dir=cache_dir, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    deepseek = lab_train(
        *TINY, "head=deepseek", "head.depth=2", f"hydra.run.dir={tmp_path / 'ds'}", cache_dir=cache_dir, cwd=tmp_path
    )
    assert deepseek.returncode == 0, deepseek.stderr[-3000:]
    records = [read_run(d) for d in sorted(sweep.iterdir()) if (d / "run.json").exists()] + [read_run(tmp_path / "ds")]
    assert [r["manifest"]["head"] for r in records] == ["linear", "parallel", "causal", "anticausal", "deepseek"]
    for record in records:
        assert record["status"] == "ok", record["error"]
        assert record["manifest"]["k"] in (3, 4) and record["k"] == record["manifest"]["k"]  # deepseek: head.depth=2 recorded as K = 3
        assert record["head_traits"] == report_traits(record["manifest"]["head"])
        cost = record["cost"]  # every variant's run.json: blocks, parameters, FLOPs/token, measured speed
        assert cost["blocks_trunk"] + cost["blocks_head"] == (5 if cost["head"] != "deepseek" else 6) and cost["blocks_trunk"] >= 1
        assert cost["params_total"] > 0 and cost["train_flops_per_token"] > 0
        assert cost["train_tokens"] == 6 * 4 * 32 and cost["train_tokens_per_s"] > 0 and cost["train_time_s"] > 0
        for k in range(1, record["manifest"]["k"] + 1):
            assert f"val/loss/h{k}" in record["final_metrics"]


def test_parameter_table_of_paper_matched_parallel_heads(tmp_path, cache_dir):
    """The issue's acceptance command: parallel K=4 over model.n_layers=8 is 4 trunk + 4 head blocks."""
    run_dir = tmp_path / "run"
    overrides = [o for o in TINY if not o.startswith(("model.n_layers", "trainer.max_steps"))]
    result = lab_train(*overrides, "head=parallel", "head.k=4", "model.n_layers=8", "trainer.max_steps=2",
                       f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "4 trunk + 4 head = 8 (next-token path 5)" in result.stdout, result.stdout[-2000:]
    cost = read_run(run_dir)["cost"]
    assert (cost["blocks_trunk"], cost["blocks_head"], cost["compute_match"]) == (4, 4, "blocks")


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["data.seq_len=1"], "data.seq_len"),
        (["data=text", "data.path=/nonexistent/corpus.txt"], "data.path"),
        (["head=nope"], "head"),
        (["head=deepseek", "head.depth=2", "head.k=4"], "head.k"),
        pytest.param(["trainer=gpu"], "trainer.accelerator", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")),
    ],
)
def test_bad_input_is_one_line_error(tmp_path, cache_dir, overrides, field):
    """In this process (real processes refusing bad input: tests/test_bad_inputs.py, tests/test_console.py)."""
    run_dir = tmp_path / "run"
    result = lab_train_in_process(*TINY, *overrides, f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and error_lines[0].startswith(f"error: {field}"), result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not (run_dir / "checkpoints").exists()
    if (run_dir / "run.json").exists():
        assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"

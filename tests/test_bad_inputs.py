"""Every bad input the fault campaign found (issue 26), through the real `lab-train` CLI in an empty
working directory: one line on stderr naming the field, no traceback, a non-zero exit, and no
folder left anywhere under the working directory (the run folder is never made, or removed
when the refused attempt made nothing else).

Most cases run the console entry in this process (`lab_train_in_process`: the same Hydra
composition, checks and exit code, without a new interpreter's ~10 s start); the cases in
`IN_A_PROCESS` run as a real `lab-train` process, one per kind of refusal (config value, data
file, checkpoint, and the plain pickle torch warns about on stderr), so what only a real process
shows — its exit status, every line it prints on stderr — stays tested."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from tests.cli import TINY, lab_train, runner

# Each case's overrides; the field its one line must name is the last override's key.
CONFIG_CASES = [
    ["model.d_model=-8"], ["optim.lr=-1"], ["optim.betas=[0.9]"], ["trainer.val_check_interval=0"], ["trainer.devices=0"],
    ["trainer.accelerator=tpu"], ["trainer.log_every_n_steps=-1"], ["data.max_val_rows=0"], ["data.max_train_rows=0"],
    ["head=parallel", "head.block=native"],  # the HF model's own layer: model=hf only
    ["callbacks.checkpoint.every_n_train_steps=-1"],  # issue 38: Lightning's 5-line error after the run folder was made
    # `_target_` nodes: a traceback inside the job (the callback's own check, WandbLogger), or accepted silently
    ["callbacks.decoding.budget_s=abc"], ["callbacks.decoding.prompts=-1"], ["logger.wandb.project=3"], ["+callbacks.decoding.promts=3"],
    ["trainer.threads=0"], ["trainer.threads=many"],
    ["schedule=sequential", "schedule.chunk_rows=64"], ["head=deepseek", "head.depth=1", "head.rollout_tokens=data"],  # read by nothing here
]

# Cases run as a real `lab-train` process (by their first override); the others run in this process.
IN_A_PROCESS = {"optim.lr=-1", "data.path={inputs}/latin1.txt", "init_from={inputs}/malicious_pickle.ckpt", "init_from={parent}/bit_flipped.ckpt"}


def everything_under(folder: Path) -> set[Path]:
    return {path.relative_to(folder) for path in folder.rglob("*")}


def assert_refused_in_one_line(result, field: str, cwd: Path, before: set[Path]) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), result.stderr[-2000:]
    assert everything_under(cwd) == before, sorted(map(str, everything_under(cwd) - before))


@pytest.mark.parametrize("overrides", CONFIG_CASES, ids=[case[-1] for case in CONFIG_CASES])
def test_a_bad_config_value_is_refused_before_any_folder_exists(tmp_path, cache_dir, overrides):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = runner(overrides, IN_A_PROCESS)(*TINY, *overrides, cache_dir=cache_dir, cwd=cwd)
    assert_refused_in_one_line(result, overrides[-1].split("=")[0].lstrip("+"), cwd, set())


class RunsACommand:
    """A pickle that would run a shell command when unpickled (what safe loading must refuse, naming the global)."""

    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def write_inputs(folder: Path) -> None:
    folder.mkdir()
    (folder / "binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    (folder / "latin1.txt").write_bytes(("hello world " * 50 + "café crème\n").encode("latin-1"))  # é at byte 603
    (folder / "not_gzip.txt.gz").write_bytes(b"plain text, not gzip\n" * 20)
    (folder / "nul.txt").write_bytes(b"\x00" * 1000)
    (folder / "bad.jsonl").write_text('{"text": "a first document"}\n{"text": "a second"}\n{"text": broken}\n')
    (folder / "good.jsonl").write_text("".join(f'{{"text": "document number {i} with a few words"}}\n' for i in range(40)))
    (folder / "huge_line.txt").write_text("word " * 20000)
    (folder / "three_bytes.txt").write_text("abc")
    (folder / "garbage.ckpt").write_bytes(b"not a checkpoint" * 10)
    torch.save({"state_dict": {}, "payload": RunsACommand()}, folder / "malicious.ckpt")
    # A plain pickle (protocol 4: torch warns about it on stderr) and a pre-zip torch.save file: no zip to scan.
    (folder / "malicious_pickle.ckpt").write_bytes(pickle.dumps({"state_dict": {}, "payload": RunsACommand()}, protocol=4))
    torch.save({"state_dict": {}, "payload": RunsACommand()}, folder / "malicious_legacy.ckpt", _use_new_zipfile_serialization=False)
    (folder / "corrupt.parquet").write_bytes(b"PAR1" + bytes(range(256)) * 4)


RUN_CASES = [  # (overrides with {inputs} for the input folder, field, words the line must hold)
    (["data=text", "data.path={inputs}/binary.txt"], "data.path", "binary.txt is not UTF-8 at byte 0"),
    (["data=text"], "data.path", "data.source=local reads local files and none is named"),  # it trained on the embedded corpus
    (["data=text", "data.path={inputs}/latin1.txt"], "data.path", "latin1.txt is not UTF-8 at byte 603"),
    (["data=text", "data.path={inputs}/not_gzip.txt.gz"], "data.path", "not_gzip.txt.gz is not gzip"),
    (["data=text", "data.path={inputs}/nul.txt"], "data.path", "NUL byte at byte 0"),
    (["data=text", "data.path={inputs}/bad.jsonl"], "data.path", "bad.jsonl: line 3 is not JSON"),
    (["data=text", "data.path={inputs}/huge_line.txt"], "data.path", "each split needs at least one"),
    (["data=text", "data.path={inputs}/three_bytes.txt"], "data.path", "each split needs at least one"),
    (["data=text", "data.path={inputs}/good.jsonl", "data.text_field=body"], "data.text_field", "'body' not found"),
    (["data.batch_size=100000"], "data.batch_size", "no full batch"),
    (["init_from={inputs}/garbage.ckpt"], "checkpoint", "truncated or corrupted"),
    (["init_from={inputs}/malicious.ckpt"], "checkpoint", "holds posix.system, which safe (weights_only) loading refuses"),
    (["init_from={inputs}/malicious_pickle.ckpt"], "checkpoint", "holds posix.system, which safe (weights_only) loading refuses"),
    (["ckpt_path={inputs}/malicious_legacy.ckpt"], "checkpoint", "holds posix.system, which safe (weights_only) loading refuses"),
    (["data=text", "data.path={inputs}/corrupt.parquet"], "data.path", "cannot read as parquet"),
    (["model.vocab_size=100"], "model.vocab_size", "must be ≥ the tokenizer's 259 ids"),
    (["init_from={parent}/truncated.ckpt"], "checkpoint", "truncated.ckpt is truncated or corrupted"),
    (["init_from={parent}/bit_flipped.ckpt"], "checkpoint", "bit_flipped.ckpt is corrupted (content digest mismatch)"),
    (["init_from={parent}", "head=parallel", "head.k=2"], "init_from", "the parent's head is 'causal' and this run's is 'parallel'"),
    (["logger=wandb", "logger.wandb.save_dir=/proc/mtp-lab-wandb"], "logger.wandb.save_dir", "cannot write /proc/mtp-lab-wandb"),
]


@pytest.fixture(scope="module")
def parent(tmp_path_factory, cache_dir):
    """A real causal K=2 run, and two damaged copies of its checkpoint (the first half; 64 bytes inverted mid-file)."""
    folder = tmp_path_factory.mktemp("parent")
    result = lab_train(*TINY, "head=causal", "head.k=2", f"hydra.run.dir={folder}", cache_dir=cache_dir, cwd=folder)
    assert result.returncode == 0, result.stderr[-2000:]
    data = (folder / "checkpoints" / "last.ckpt").read_bytes()
    (folder / "truncated.ckpt").write_bytes(data[: len(data) // 2])
    middle = len(data) // 2
    (folder / "bit_flipped.ckpt").write_bytes(data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:])
    return folder


@pytest.mark.parametrize("overrides, field, words", RUN_CASES, ids=[" ".join(case[0]).split("/")[-1] for case in RUN_CASES])
def test_bad_data_checkpoints_and_folders_are_refused_in_one_line_leaving_no_folder(tmp_path, cache_dir, parent, overrides, field, words):
    cwd, inputs = tmp_path / "cwd", tmp_path / "inputs"
    cwd.mkdir()
    write_inputs(inputs)
    result = runner(overrides, IN_A_PROCESS)(*TINY, *[o.format(inputs=inputs, parent=parent) for o in overrides], cache_dir=cache_dir, cwd=cwd)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert_refused_in_one_line(result, field, cwd, set())
    assert words in result.stderr, result.stderr[-2000:]

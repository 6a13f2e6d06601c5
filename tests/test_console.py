"""What a researcher sees: the console of a short run, its wandb run config, one-line errors."""

import csv

import pytest

from tests.cli import TINY, lab_train, runner, wandb_config

NOISE = (
    "litlogger",  # Lightning's advertisement
    "limit_val_batches=1.0",  # our own config written out
    "anonymous setting has no effect",  # wandb, caused by Lightning's WandbLogger
    "exists and is not empty",  # CSV logger on a fresh run dir
    "LeafSpec",  # Lightning's use of a deprecated torch API
)


def test_a_fresh_five_step_run_is_quiet_has_prefixed_wandb_config_and_validates_once_at_its_end(tmp_path, cache_dir):
    """One fresh 5-step run (each run is ~1 min of a loaded CI core): its console, wandb config and CSV rows; and,
    started with ckpt_path=last on an empty run dir, it says it trains from step 0 and validates once, at its end."""
    run_dir = tmp_path / "run"
    result = lab_train(*TINY, "trainer.max_steps=5", "trainer.val_check_interval=200", "head=parallel", "head.k=2", "sweep_name=console_check",
                       "ckpt_path=last", f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    console = result.stdout + result.stderr
    for noise in NOISE:
        assert noise not in console, f"{noise!r} in the console:\n{console}"
    # a resume that finds nothing to resume says so (a mistyped run dir must not go unnoticed)
    assert f"ckpt_path=last: no checkpoint at {run_dir / 'checkpoints' / 'last.ckpt'}; training from step 0" in result.stderr
    validated = [int(row["step"]) for row in csv.DictReader((run_dir / "metrics.csv").open()) if row.get("val/loss")]
    assert validated == [4]  # once, after the 5th (last) step; Lightning counts steps from 0 in the log
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith(f"done: {run_dir} | val/loss ") and " bits/byte) | 5 steps | " in last, last
    wandb_id = last.split("wandb run ")[1].split(";")[0]
    (offline_run,) = (run_dir / "wandb").glob(f"offline-run-*-{wandb_id}")
    assert last.endswith(f"; sync: wandb sync {offline_run}")
    rows = [row for row in csv.DictReader((run_dir / "metrics.csv").open()) if row.get("train/loss")]
    assert len(rows) == 5
    for row in rows:  # head_mean, uniform λ, K=2: the objective is the sum of the two horizons' mean losses
        assert float(row["train/loss"]) == pytest.approx(float(row["train/loss/h1"]), rel=1e-6)
        assert float(row["train/objective"]) == pytest.approx(float(row["train/loss/h1"]) + float(row["train/loss/h2"]), rel=1e-6)
    config = wandb_config(run_dir)
    assert config["data.seq_len"] == 32 and config["head.k"] == 2 and config["head.name"] == "parallel"
    assert config["trainer.max_steps"] == 5 and config["model.d_model"] == 32
    assert config["sweep_name"] == "console_check" and config["run_dir"] == str(run_dir)
    assert "trainer.max_steps=5" in config["overrides"] and "head.k=2" in config["overrides"]
    assert "seq_len" not in config  # no unprefixed DataModule fields at top level


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["head.k=abc"], "error: head.k: must be an integer, got 'abc'"),
        (["logger=null"], "error: logger: null is not an option (use logger=none to turn it off); allowed: "),
        (["haed=parallel"], "error: haed: no such config group or setting (did you mean head?)"),
        (["trainer.max_step=20"], "error: trainer.max_step: no such setting (did you mean trainer.max_steps?)"),
        (["head=paralel"], "error: head: unknown option 'paralel' (did you mean parallel?); allowed: "),
        (["data=text", "data.path={empty}"], "error: data.path: {empty} is empty (0 bytes)"),
        (["ckpt_path={corrupt}"], "error: checkpoint: {corrupt} is truncated or corrupted (RuntimeError: PytorchStreamReader "
                                  "failed reading zip archive: failed finding central directory); "),
        (["head=deepseek", "head.depth=2", "head.k=4"], "error: head.k: deepseek needs head.k = head.depth + 1 = 3, got 4"),
        (["head=parallel", "head.k=2", "head.draft_vocab=ten"], "error: head.draft_vocab: value 'ten' of type 'str' could not be converted to Integer"),
    ],
)
def test_bad_input_is_one_line_and_leaves_no_run_folder(tmp_path, cache_dir, overrides, expected):
    """In this process but for one case of the pre-flight checks and one of the checkpoint checks (tests/cli.py `runner`)."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(zip_prefix())  # the first half of a zip archive: no central directory
    paths = {"empty": empty, "corrupt": corrupt}
    run_dir = tmp_path / "run"
    result = runner(overrides, {"head.k=abc", "ckpt_path={corrupt}"})(*TINY, *[o.format(**paths) for o in overrides], f"hydra.run.dir={run_dir}",
                                                                     cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(expected.format(**paths)), result.stderr[-2000:]
    assert not run_dir.exists()


def test_a_model_path_naming_a_file_says_so(tmp_path):
    """Issue 56: an existing file was reported as "no such folder"."""
    from lab.errors import ConfigError
    from lab.model.hf_trunk import local_folder

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"^model\.path: .*model\.safetensors is a file, not a folder; give the folder of a Hugging Face model"):
        local_folder(str(weights), "model.path")
    with pytest.raises(ConfigError, match=r"^model\.path: no such folder"):
        local_folder(str(tmp_path / "absent"), "model.path")


def zip_prefix() -> bytes:
    """Half of a real zip archive (what an interrupted copy of a checkpoint looks like)."""
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("archive/data.pkl", b"x" * 4096)
    data = buffer.getvalue()
    return data[: len(data) // 2]


def test_progress_bar_rates_are_plain_numbers():
    from lab.callbacks.progress import human_rate

    assert [human_rate(v) for v in (950.4, 12345.6, 2_500_000.0)] == ["950", "12.3k", "2.50M"]


def test_help_names_lab_train_and_lists_groups_and_experiments(tmp_path, cache_dir):
    result = lab_train("--help", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("lab-train: ") and "usage: lab-train" in result.stdout
    assert "  head:           anticausal, causal, deepseek, identity, linear, medusa, ntp*, parallel" in result.stdout
    assert "  model:          gpt2_small, hf, small, smollm2, tiny*" in result.stdout
    assert "  debug:          fast, overfit, profile" in result.stdout and "  search_lambda  " in result.stdout
    assert "train is powered by Hydra" not in result.stdout

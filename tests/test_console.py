"""What a researcher sees: the console of a short run, its wandb run config, one-line errors."""

from tests.cli import TINY, lab_train, wandb_config

NOISE = (
    "litlogger",  # Lightning's advertisement
    "limit_val_batches=1.0",  # our own config written out
    "anonymous setting has no effect",  # wandb, caused by Lightning's WandbLogger
    "exists and is not empty",  # CSV logger on a fresh run dir
    "LeafSpec",  # Lightning's use of a deprecated torch API
)


def test_five_step_run_console_is_quiet_and_wandb_config_has_group_prefixes(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    result = lab_train(*TINY, "trainer.max_steps=5", "head=parallel", "head.k=2", "sweep_name=console_check",
                       f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    console = result.stdout + result.stderr
    for noise in NOISE:
        assert noise not in console, f"{noise!r} in the console:\n{console}"
    config = wandb_config(run_dir)
    assert config["data.seq_len"] == 32 and config["head.k"] == 2 and config["head.name"] == "parallel"
    assert config["trainer.max_steps"] == 5 and config["model.d_model"] == 32
    assert config["sweep_name"] == "console_check" and config["run_dir"] == str(run_dir)
    assert "trainer.max_steps=5" in config["overrides"] and "head.k=2" in config["overrides"]
    assert "seq_len" not in config  # no unprefixed DataModule fields at top level

"""Start-up checks on the real composed configs (Hydra compose API, same build path as the CLI)."""

import csv
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lab.config.preflight import check_single_run, preflight
from lab.model.compile import split_compile_option
from lab.model.heads import head_config
from lab.model.mtp import model_config
from lab.model.trunks import trunk_layers
from lab.errors import ConfigError
from lab.train import CONF_DIR, build
from tests.cli import TINY, lab_train


def composed(overrides, cache_dir):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=[*TINY, *overrides, f"paths.cache_dir={cache_dir}", "paths.output_dir=/tmp/unused"])


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["data.seq_len=1"], "data.seq_len"),
        (["data.min_doc_chars=100000000"], "data"),
        (["data.tokenizer=bpe", "data.vocab_size=100"], "data.vocab_size"),
        (["head=parallel", "head.k=0"], "head.k"),
        (["head=parallel", "head.k=32", "head.compute_match=none"], "head.k"),
        (["head=deepseek", "head.depth=2", "head.k=4"], "head.k"),
        (["head=anticausal", "head.k=3", "model.n_layers=3", "head.compute_match=next_token_path"], "head.compute_match"),
        (["head=parallel", "head.k=6"], "head.compute_match"),  # TINY: 6 layers, 6 head blocks
        (["head=parallel", "head.compute_match=layers"], "head.compute_match"),
        (["head=parallel", "head.unembedding=twice"], "head.unembedding"),
        (["reduction=fixed", "reduction.fixed_denominator=0"], "reduction.fixed_denominator"),
        (["reduction=head_mean", "reduction.count_scope=world"], "reduction.count_scope"),
        (["head=parallel", "head.k=2", "weights.lambdas=[1,2,3]"], "weights.lambdas"),
        (["head=parallel", "head.k=2", "weights.lambdas=[1,-1]"], "weights.lambdas"),
        (["head=parallel", "head.k=2", "weights.lambdas=[1,.nan]"], "weights.lambdas"),
        (["head=parallel", "head.k=2", "weights=geometric", "weights.gamma=0"], "weights.gamma"),
        (["schedule=chunked", "schedule.chunk_rows=0"], "schedule.chunk_rows"),
        (["trainer.precision=fp8"], "trainer.precision"),
        # issue 38: values that trained (clamped, ignored or sign-flipping) instead of being refused
        (["optim.warmup_steps=-1"], "optim.warmup_steps"),
        (["optim.grad_clip=-1"], "optim.grad_clip"),
        (["optim.grad_clip=0"], "optim.grad_clip"),
        (["optim.min_lr_ratio=2"], "optim.min_lr_ratio"),
        (["optim.head_lr_multiplier=0"], "optim.head_lr_multiplier"),
        (["head=identity", "head.k=3", "head.n_layers=2"], "head.n_layers"),
        (["head=linear", "head.k=2", "head.block=native"], "head.block"),
        (["head=medusa", "head.k=2", "head.init=copy_last"], "head.init"),
        (["head=deepseek", "head.depth=1", "head.n_layers=3"], "head.n_layers"),
        (["callbacks.checkpoint.every_n_train_steps=-1"], "callbacks.checkpoint.every_n_train_steps"),
        (["callbacks.checkpoint.every_n_train_steps=0"], "callbacks.checkpoint.every_n_train_steps"),
        (["ckpt_path=" + __file__, "init_from=/some/parent"], "ckpt_path"),  # any existing file: the pair is refused first
        (["model.vocab_size=100"], "model.vocab_size"),  # the byte tokenizer has 259 ids
        # found by tests/test_chaos_mutations.py: tracebacks from torch or Lightning
        (["model.mlp_ratio=-4"], "model.mlp_ratio"),
        (["model.init_std=-0.02"], "model.init_std"),
        (["head=parallel", "head.k=2", "head.offsets=-1"], "head.offsets"),
        (["trainer.devices=-1"], "trainer.devices"),  # all devices: fine on GPUs, a TypeError on the cpu accelerator
        (["trainer.strategy=no_such_option"], "trainer.strategy"),
        (["trainer.strategy=7"], "trainer.strategy"),
        (["trainer.check_val_every_n_epoch=abc"], "trainer.check_val_every_n_epoch"),
        (["trainer.limit_val_batches=-1"], "trainer.limit_val_batches"),
    ],
)
def test_bad_config_raises_naming_the_field(overrides, field, cache_dir):
    with pytest.raises(ConfigError) as error:
        build(composed(overrides, cache_dir))
    assert str(error.value).startswith(field), str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "argv, field",
    [(["head=nope"], "head"), (["reduction=sum,nope"], "reduction"), (["schedule=fast"], "schedule"), (["weights=x"], "weights")],
)
def test_unknown_group_option_lists_allowed(argv, field):
    with pytest.raises(ConfigError) as error:
        preflight(argv, Path(CONF_DIR))  # what lab-train runs before Hydra
    assert error.value.field == field and "allowed:" in str(error.value)


def test_valid_config_builds(cache_dir):
    datamodule, module = build(composed(["head=parallel", "head.k=2", "reduction=deepseek_paper"], cache_dir))
    assert module.model.k == 2 and datamodule.vocab_size == 259


HEAD_OPTIONS = sorted(path.stem for path in (Path(CONF_DIR) / "head").glob("*.yaml"))


@pytest.mark.parametrize("head", HEAD_OPTIONS)
def test_every_head_option_fits_the_default_model_and_data(head):
    """`lab-train head=<each>` with nothing else: the default model and data keep ≥ 2 trunk blocks under
    the default compute matching, and every start-up check a run makes before training passes."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[f"head={head}"])
    check_single_run(cfg)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    model, _ = split_compile_option({**model, "vocab_size": 259})
    head_cfg = head_config(OmegaConf.to_container(cfg.head, resolve=True))
    assert trunk_layers(model_config(model), head_cfg) >= 2, head


@pytest.mark.slow
def test_a_sweep_over_every_head_option_trains_with_the_defaults(tmp_path, cache_dir):
    """`lab-train -m head=<all> trainer.max_steps=2`: every job ok on the default model and data."""
    result = lab_train("-m", f"head={','.join(HEAD_OPTIONS)}", "trainer.max_steps=2", "data.max_val_rows=32", "callbacks.decoding.new_tokens=4",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(tmp_path / "sweep" / "runs.csv", newline="") as table:  # the sweep report's one row per job
        statuses = {row["head"]: row["status"] for row in csv.DictReader(table)}
    assert statuses == {head: "ok" for head in HEAD_OPTIONS}, statuses

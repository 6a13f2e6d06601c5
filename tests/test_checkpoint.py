"""Checkpoint semantics (lab/checkpoint/): manifest, mismatch refusal, aliases, damage, atomic writes."""

from __future__ import annotations

import hashlib
import io
import shutil

import pytest
import torch
import torch.nn as nn

from lab.checkpoint import (
    alias_key_groups,
    build_manifest,
    check_state_aliases,
    horizon_map,
    load_checkpoint,
    validate_checkpoint,
    verify_restored,
)
from lab.checkpoint.manifest import compare_manifests
from lab.checkpoint.io import SafeCheckpointIO
from lab.errors import ConfigError
from lab.train import build
from tests.cli import TINY, lab_train_in_process
from tests.fit_helpers import compose_cfg, fit
from tests.helpers import build_model

K4 = ["head=parallel", "head.k=4"]


@pytest.fixture(scope="module")
def k4_run(tmp_path_factory, cache_dir):
    """A real 2-step fit of a parallel K = 4 model; its last.ckpt is the checkpoint under test."""
    run_dir = tmp_path_factory.mktemp("k4")
    _, module, datamodule = fit(compose_cfg(*K4, cache_dir=cache_dir), run_dir, max_steps=2)
    return run_dir / "checkpoints" / "last.ckpt", module, datamodule


def sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def expected_for(*overrides, cache_dir):
    """(manifest the composed config expects, its module): what `lab-train` checks a checkpoint against."""
    datamodule, module = build(compose_cfg(*overrides, cache_dir=cache_dir))
    return build_manifest(module, datamodule), module


def one_line_error(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text and text.startswith("checkpoint: "), text
    return text


# ------------------------------------------------------------------------------ manifest


@pytest.mark.parametrize(
    "name, k, head, expected",
    [
        ("parallel", 3, {}, {"stacks.0": 1, "stacks.2": 3}),
        ("causal", 3, {}, {"stacks.1": 2}),
        ("anticausal", 2, {}, {"stacks.0": 1, "stacks.1": 2}),
        ("linear", 3, {}, {"maps.0": 1, "maps.2": 3}),
        ("linear", 2, {"unembedding": "replicated"}, {"projections.0": 1, "projections.1": 2}),
        ("deepseek", 3, {"depth": 2}, {"depth_modules.0": 2, "depth_modules.1": 3}),
        ("deepseek", 3, {"depth": 2, "share_depth_weights": True}, {"depth_modules.0": "all"}),
    ],
)
def test_every_head_key_has_its_horizon(name, k, head, expected):
    model = build_model(name, k, layers=4, **head)
    horizons = horizon_map(model)
    assert set(horizons) == {f"model.head.{key}" for key in model.head.state_dict()}
    for prefix, horizon in expected.items():
        keys = [key for key in horizons if key.startswith(f"model.head.{prefix}")]
        assert keys and all(horizons[key] == horizon for key in keys), (prefix, horizon)


def test_checkpoint_carries_a_weights_only_manifest(k4_run):
    path, module, datamodule = k4_run
    checkpoint = torch.load(path, weights_only=True)  # nothing in it needs unpickling code
    manifest = checkpoint["mtp_manifest"]
    assert (manifest["head"], manifest["k"], manifest["depth"]) == ("parallel", 4, None)
    assert manifest["horizons"]["model.head.stacks.3.blocks.0.mlp.up.weight"] == 4
    assert manifest["aliases"] == [["model.trunk.embed.weight", "model.trunk.unembed"]]
    assert manifest["weights"] == {"name": "uniform", "lambdas": None}
    assert manifest["weight_position"] == {"step": 2, "consumed_tokens": checkpoint["mtp_state"]["consumed_tokens"]}
    assert manifest["weight_position"]["consumed_tokens"] > 0
    assert (manifest["reduction"], manifest["count_scope"], manifest["schedule"]) == ("head_mean", "global", "sequential")
    assert manifest["tokenizer"] == {"kind": "byte", "vocab_size": 259}
    assert manifest["corpus_fingerprint"] == datamodule.corpus_fingerprint
    assert manifest["packing"].startswith("eos-packed") and manifest["versions"]["torch"]
    assert set(checkpoint["mtp_state"]["rng"]) >= {"torch", "numpy", "python"}
    validate_checkpoint(path, build_manifest(module, datamodule), module)  # its own config accepts it


# -------------------------------------------------------------------- mismatch refusal


def test_manifest_from_before_offsets_and_targets_still_resumes(k4_run, cache_dir):
    """A checkpoint written before head.offsets / objective.target / head.draft_vocab existed trained offsets 1..K on data
    targets over the full vocabulary."""
    path, module, datamodule = k4_run
    manifest = torch.load(path, weights_only=True)["mtp_manifest"]
    del manifest["offsets"], manifest["target"], manifest["head_config"]["offsets"], manifest["head_config"]["draft_vocab"]

    compare_manifests(manifest, build_manifest(module, datamodule))  # accepted as what it trained
    leap, _ = expected_for(*K4, "head.offsets=[1,2,3,5]", cache_dir=cache_dir)
    with pytest.raises(ConfigError) as excinfo:
        compare_manifests(manifest, leap)  # ... and still refused for what it did not
    assert "offsets differs" in one_line_error(excinfo)
    restricted, _ = expected_for(*K4, "head.draft_vocab=20", cache_dir=cache_dir)
    with pytest.raises(ConfigError) as excinfo:
        compare_manifests(manifest, restricted)  # written before draft vocabularies: it trained on the full one
    assert "head.draft_vocab differs: checkpoint has None, config has 20" in one_line_error(excinfo)


def test_k4_checkpoint_with_k2_config_is_refused_by_the_cli(k4_run, tmp_path, cache_dir):
    path, _, _ = k4_run
    run_dir = tmp_path / "run"
    result = lab_train_in_process(*TINY, "head=parallel", "head.k=2", f"ckpt_path={path}", f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: checkpoint: head.k differs: checkpoint has 4, config has 2"], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not (run_dir / "checkpoints").exists()


def test_parallel_checkpoint_as_causal_is_refused(k4_run, cache_dir):
    path, _, _ = k4_run
    expected, module = expected_for("head=causal", "head.k=4", cache_dir=cache_dir)
    with pytest.raises(ConfigError) as excinfo:
        validate_checkpoint(path, expected, module)
    assert one_line_error(excinfo) == "checkpoint: head.name differs: checkpoint has parallel, config has causal"


def test_checkpoint_with_another_tokenizer_is_refused(k4_run, cache_dir):
    path, _, _ = k4_run
    expected, module = expected_for(*K4, "data.tokenizer=bpe", "data.vocab_size=300", cache_dir=cache_dir)
    with pytest.raises(ConfigError) as excinfo:
        validate_checkpoint(path, expected, module)
    assert one_line_error(excinfo) == "checkpoint: tokenizer.kind differs: checkpoint has byte, config has bpe"


def test_schedule_position_is_state_not_config(k4_run, cache_dir):
    """A resume is checked on what the run *is*; where its λ schedule stands may differ."""
    path, _, _ = k4_run
    expected, module = expected_for(*K4, "trainer.max_steps=50", cache_dir=cache_dir)
    validate_checkpoint(path, expected, module)
    expected, module = expected_for(*K4, "weights=geometric", cache_dir=cache_dir)
    with pytest.raises(ConfigError, match=r"weights.name differs: checkpoint has uniform, config has geometric"):
        validate_checkpoint(path, expected, module)


# ------------------------------------------------------------------------------ aliases


def test_resumed_aliases_are_one_parameter_with_one_optimizer_state(k4_run, tmp_path, cache_dir):
    path, _, _ = k4_run
    trainer, module, _ = fit(compose_cfg(*K4, cache_dir=cache_dir), tmp_path, max_steps=3, ckpt_path=str(path))
    model, optimizer = module.model, trainer.optimizers[0]
    assert model.trunk.unembedding is model.trunk.embed.weight
    params = list(module.parameters())
    bound = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(bound) == len({id(p) for p in bound}) == len(params)
    assert len(optimizer.state) == len(params) and all(int(s["step"]) == 3 for s in optimizer.state.values())
    verify_restored(module, optimizer)


def test_broken_tied_alias_is_refused(k4_run, tmp_path):
    path, module, datamodule = k4_run
    checkpoint = torch.load(path, weights_only=True)
    embed = checkpoint["state_dict"]["model.trunk.embed.weight"]
    checkpoint["state_dict"]["model.trunk.unembed"] = embed + 0.5  # a tied model storing a second, different unembedding
    del checkpoint["mtp_digest"]
    broken = tmp_path / "broken.ckpt"
    torch.save(checkpoint, broken)
    with pytest.raises(ConfigError) as excinfo:
        validate_checkpoint(broken, build_manifest(module, datamodule), module)
    assert "broken alias: model.trunk.embed.weight and model.trunk.unembed" in one_line_error(excinfo)
    checkpoint["state_dict"]["model.trunk.unembed"] = embed.clone()  # a harmless duplicate is still not loaded silently
    torch.save(checkpoint, broken)
    with pytest.raises(ConfigError, match="unexpected key model.trunk.unembed"):
        validate_checkpoint(broken, build_manifest(module, datamodule), module)


def test_registered_alias_groups_are_checked_in_state_and_after_load():
    model = build_model("parallel", 2, layers=3)
    model.head.register_parameter("draft_unembedding", model.trunk.embed.weight)  # a head holding the shared Parameter
    groups = alias_key_groups(model)
    assert ["model.trunk.embed.weight", "model.head.draft_unembedding"] in groups
    state = {f"model.{key}": value.clone() for key, value in model.state_dict().items()}
    check_state_aliases(state, groups)  # both keys, one tensor: fine
    state["model.head.draft_unembedding"] += 1
    with pytest.raises(ConfigError, match="broken alias"):
        check_state_aliases(state, groups)

    class Holder(nn.Module):  # the LightningModule's shape: the MTP model under `model`
        def __init__(self, model):
            super().__init__()
            self.model = model

    holder = Holder(model)
    verify_restored(holder, torch.optim.AdamW(holder.parameters()), groups)
    model.head.draft_unembedding = nn.Parameter(model.trunk.embed.weight.detach().clone())  # alias split on load
    with pytest.raises(RuntimeError, match="no longer one Parameter"):
        verify_restored(holder, groups=groups)
    holder = Holder(build_model("parallel", 2, layers=3))
    stray = nn.Parameter(holder.model.trunk.embed.weight.detach().clone())  # e.g. a second copy of the unembedding
    with pytest.raises(RuntimeError, match="exactly once"):
        verify_restored(holder, torch.optim.SGD([*holder.parameters(), stray], lr=0.1))


# --------------------------------------------------------------------- damaged files


def test_truncated_last_checkpoint_is_one_line_and_spares_the_others(k4_run, tmp_path, cache_dir):
    path, module, datamodule = k4_run
    run_dir = tmp_path / "run"
    folder = run_dir / "checkpoints"
    folder.mkdir(parents=True)
    good = folder / "epoch=0-step=2.ckpt"
    shutil.copy(path, good)
    (folder / "last.ckpt").write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    before = {p.name: sha(p) for p in folder.iterdir()}
    result = lab_train_in_process(*TINY, *K4, "ckpt_path=last", f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "last.ckpt is truncated or corrupted" in errors[0] and "epoch=0-step=2.ckpt" in errors[0], errors
    assert "Traceback" not in result.stderr
    assert {p.name: sha(p) for p in folder.iterdir()} == before  # nothing deleted or rewritten
    validate_checkpoint(good, build_manifest(module, datamodule), module)


def test_corrupted_bytes_garbage_and_unsafe_pickles_are_refused(k4_run, tmp_path):
    path, _, _ = k4_run
    data = bytearray(path.read_bytes())
    embed = torch.load(path, weights_only=True)["state_dict"]["model.trunk.embed.weight"]
    at = bytes(data).find(embed.numpy().tobytes()[:64])
    assert at > 0
    data[at + 10] ^= 0xFF  # one flipped bit pattern inside a weight: torch.load alone would not notice
    flipped = tmp_path / "flipped.ckpt"
    flipped.write_bytes(bytes(data))
    with pytest.raises(ConfigError) as excinfo:
        load_checkpoint(flipped)
    assert "is corrupted (content digest mismatch)" in one_line_error(excinfo)

    for name, content in (("garbage.ckpt", b"not a checkpoint" * 10), ("empty.ckpt", b"")):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ConfigError) as excinfo:
            load_checkpoint(tmp_path / name)
        assert "truncated or corrupted" in one_line_error(excinfo)

    buffer = io.BytesIO()
    torch.save({"state_dict": {}, "payload": Unsafe()}, buffer)
    (tmp_path / "unsafe.ckpt").write_bytes(buffer.getvalue())
    with pytest.raises(ConfigError) as excinfo:
        load_checkpoint(tmp_path / "unsafe.ckpt")
    assert f"holds {Unsafe.__module__}.Unsafe, which safe (weights_only)" in one_line_error(excinfo)  # torch's scan names the global


class Unsafe:
    """An arbitrary object: weights_only loading must refuse to run its unpickling."""


def test_checkpoint_without_manifest_is_refused(k4_run, tmp_path):
    path, module, datamodule = k4_run
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["mtp_manifest"], checkpoint["mtp_digest"]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    with pytest.raises(ConfigError, match="has no MTP manifest"):
        validate_checkpoint(tmp_path / "old.ckpt", build_manifest(module, datamodule), module)


# ------------------------------------------------------------------------ atomic writes


def test_crash_mid_write_leaves_previous_last_checkpoint_loadable(tmp_path, cache_dir, monkeypatch):
    cfg = compose_cfg(cache_dir=cache_dir)
    fit(cfg, tmp_path, max_steps=2)
    last = tmp_path / "checkpoints" / "last.ckpt"
    before = sha(last)

    def crash_half_way(self, checkpoint, file):
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        file.write(buffer.getvalue()[: buffer.tell() // 2])
        file.flush()
        raise OSError("simulated crash while writing the checkpoint")

    monkeypatch.setattr(SafeCheckpointIO, "_write", crash_half_way)
    with pytest.raises(OSError, match="simulated crash"):
        fit(cfg, tmp_path, max_steps=4, ckpt_path=str(last))  # the step-4 save dies half-way
    assert sha(last) == before
    assert load_checkpoint(last)["global_step"] == 2
    assert sorted(p.name for p in last.parent.iterdir()) == ["last.ckpt"]  # the partial temp file is gone

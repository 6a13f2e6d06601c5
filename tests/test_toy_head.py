"""A new head architecture is one spec, one registry line and one YAML (docs/heads.md, "Adding an architecture").

The toy architecture below is defined here, outside lab/: horizon 1 is the trunk state itself, horizon k ≥ 2
the trunk state times a learned per-horizon gain vector `gains.{k-2}`, with an option of its own
(`init_gain`); its whole computation is one rows function (`horizon_rows`); it drafts with the shared
independent drafter and declares a release layout of its own ("toy": the whole model as one safetensors file
beside a config.json). It is registered with `register_head` (removed after each test) and, in the first test,
its YAML sits in a temporary config folder on Hydra's search path. Nothing else in the harness is told about
it: it trains (the real config composed by Hydra, a real Trainer), decodes exactly (speculative greedy ==
plain greedy), goes through `lab-export --format toy` and back through `lab-generate`'s loader and
`init_from`, and its checkpoints carry its manifest, resume bitwise and export as next-token and keep-heads
releases.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from lab.checkpoint import build_manifest, load_checkpoint, validate_checkpoint
from lab.release.export import export, load_release, sha256_file
from lab.release.export import main as lab_export
from lab.release.init_from import load_parent_weights
from lab.decode import generate
from lab.decode.loading import load_for_generation
from lab.errors import ConfigError, require
from lab.checkpoint import plain
from lab.model import build_model
from lab.model.heads import HEAD_SPECS, head_spec, register_head, unregister_head
from lab.model.heads import HeadConfig, MTPHead
from lab.model.heads.independent_drafter import IndependentHeads
from lab.model.heads.spec import HeadSpec
from lab.release import InitFromReader, LoadedFolder, ParentWeights, ReleaseLayout, register_layout, release_layouts, unregister_layout
from lab.release.hf_folder import staged_folder
from tests.fit_helpers import compose_cfg, fit, searchpath_with

pytestmark = pytest.mark.usefixtures("single_thread")

TOY_YAML = """\
# `head=toy head.k=K`: the test's own architecture (tests/test_toy_head.py)
defaults:
  - ntp
  - _self_
name: toy
k: 3
init_gain: 0.5
"""
TOY_FORMAT = "toy-mtp"


@dataclass
class ToyConfig(HeadConfig):
    name: str = "toy"
    init_gain: float = 1.0


class ToyHead(MTPHead):
    """Horizon 1 is the trunk state itself; horizon k ≥ 2 is the trunk state times its own learned gain vector."""

    config_class = ToyConfig
    horizon_containers = {**MTPHead.horizon_containers, "gains": 2}  # gains.i serves horizon i + 2
    drafter = IndependentHeads  # drafts with the shared independent-heads drafter
    unused_options = ("n_layers", "init", "block")

    @classmethod
    def check_config(cls, cfg):
        super().check_config(cfg)
        if not cfg.init_gain > 0:
            raise ConfigError("head.init_gain", f"must be > 0, got {cfg.init_gain}")

    def __init__(self, cfg, model_cfg):
        super().__init__(cfg, model_cfg)
        self.gains = nn.ParameterList(nn.Parameter(torch.full((model_cfg.d_model,), cfg.init_gain)) for _ in range(cfg.k - 1))

    def horizon_rows(self, trunk_hidden, ctx_for, extra=None):
        """Its one computation: training (`MTPHead.forward`) and decoding both read it."""
        yield trunk_hidden  # [B, S, d]: horizon 1
        for gain in self.gains:
            yield (trunk_hidden if extra is None else extra) * gain  # [B, S, d]: horizons 2..K


def export_toy(checkpoint: dict, out: Path, model) -> str:
    require(isinstance(model.head, ToyHead), "--format", f"toy exports head=toy runs; this checkpoint's head is '{model.head_cfg.name}'")
    from safetensors.torch import save_file

    tensors = {key: value.detach().clone().contiguous() for key, value in model.state_dict().items()}  # own storage each (tied weights)
    config = {"format": TOY_FORMAT, "model": plain(model.model_cfg), "head": plain(model.head_cfg),
              "tokenizer": checkpoint["mtp_manifest"]["tokenizer"]}
    with staged_folder(out) as tmp:
        save_file(tensors, tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(config))
    return f"toy folder: {out}"


def is_toy_folder(path: Path) -> bool:
    config = path / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("format") == TOY_FORMAT


def load_toy(folder: Path) -> LoadedFolder:
    from safetensors.torch import load_file

    from lab.data.tokenizers import tokenizer_from_identity

    config = json.loads((folder / "config.json").read_text())
    model = build_model(config["model"], config["head"])
    model.load_state_dict(load_file(folder / "model.safetensors"), strict=True)
    return LoadedFolder(model.eval(), tokenizer_from_identity(config["tokenizer"]))


def toy_parent(folder: Path, model) -> ParentWeights:
    """The folder as the parent of `init_from=<folder>`: its weights, model config, tokenizer and head."""
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    return ParentWeights(load_file(folder / "model.safetensors"), config["model"], config["tokenizer"], config["head"]["name"])


TOY = HeadSpec(name="toy", module=ToyHead, display_rank=100, release_layouts=("toy",))
TOY_LAYOUT = ReleaseLayout(name="toy", help="the test's toy layout", export=export_toy, recognizes=is_toy_folder, load=load_toy,
                           init_from=InitFromReader(kind="toy", read=toy_parent, identity_file=lambda folder: folder / "model.safetensors"))


@pytest.fixture
def toy_head():
    register_head(TOY)  # the registry lines: the head, and the layout its spec names
    register_layout(TOY_LAYOUT)
    yield TOY
    unregister_head(TOY.name)
    unregister_layout(TOY_LAYOUT.name)


@pytest.fixture
def toy_conf(tmp_path) -> str:
    return searchpath_with(tmp_path, "head", "toy", TOY_YAML)


def test_a_head_defined_outside_lab_trains_decodes_exactly_and_round_trips_its_layout(toy_head, toy_conf, tmp_path):
    cfg = compose_cfg(toy_conf, "head=toy", "callbacks.decoding.prompts=0", cache_dir=tmp_path / "cache")
    assert (cfg.head.name, cfg.head.k, cfg.head.init_gain) == ("toy", 3, 0.5)  # the temporary head/toy.yaml, found on the search path
    _, module, _ = fit(cfg, tmp_path / "run", max_steps=4)
    model = module.model.eval()
    assert isinstance(model.head, ToyHead) and model.k == 3
    assert all(not torch.equal(gain, torch.full_like(gain, 0.5)) for gain in model.head.gains)  # both horizons' own weights trained

    # Exact decoding: greedy speculative with the toy's drafts emits plain greedy's tokens.
    vocab = model.model_cfg.vocab_size
    for seed, length in ((0, 1), (1, 7)):
        prompt = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed))
        plain_run = generate(model, prompt, 24)
        spec = generate(model, prompt, 24, speculative=True)
        assert spec.tokens == plain_run.tokens
        assert sum(spec.stats["proposed_by_position"]) > 0  # the toy head drafted

    # Its release layout: lab-export --format toy, then lab-generate's loader reads the folder back.
    out = tmp_path / "toy-release"
    lab_export([str(tmp_path / "run" / "checkpoints" / "last.ckpt"), "--format", "toy", "--out", str(out)])
    loaded = load_for_generation(out)
    assert loaded.source == "toy" and isinstance(loaded.model.head, ToyHead)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value), key
    prompt = torch.tensor([3, 1, 4, 1, 5])
    assert generate(loaded.model, prompt, 24, speculative=True).tokens == generate(model, prompt, 24).tokens

    # init_from=<the folder> finds the layout's reader in the registry: every weight lands in a fresh model.
    child = build_model(plain(model.model_cfg), plain(model.head_cfg))
    record = load_parent_weights(child, str(out))
    assert record["kind"] == "toy" and record["sha256"] == sha256_file(out / "model.safetensors")
    assert all(torch.equal(child.state_dict()[key], value) for key, value in model.state_dict().items())


def test_registering_is_checked_and_undone(toy_head):
    assert head_spec("toy") is TOY and "toy" in release_layouts()
    with pytest.raises(ConfigError, match=r"^head.name: 'toy' is registered already"):
        register_head(TOY)
    with pytest.raises(ConfigError, match=r"^head.name: 'ntp' is a shipped head"):
        unregister_head("ntp")
    with pytest.raises(ConfigError, match=r"^release_layouts: format 'toy' is registered already"):
        register_layout(TOY_LAYOUT)
    with pytest.raises(ConfigError, match=r"^release_layouts: 'medusa' is a shipped layout"):
        unregister_layout("medusa")
    unregister_head("toy")
    assert "toy" not in HEAD_SPECS and "toy" not in release_layouts()
    with pytest.raises(ConfigError, match=r"^head.name: unknown head 'toy'; allowed: ntp, linear, "):
        head_spec("toy")
    register_head(TOY)  # for the fixture's own removal


TOY_OVERRIDES = ["head.name=toy", "head.k=3", "+head.init_gain=0.5"]


def test_toy_head_trains_checkpoints_resumes_and_exports(toy_head, tmp_path, tiny_cfg):
    cfg = tiny_cfg(*TOY_OVERRIDES)
    # Uninterrupted: 4 steps. Interrupted: 2 steps, then a resume from the step-2 checkpoint to 4.
    _, full, datamodule = fit(cfg, tmp_path / "full", max_steps=4)
    fit(cfg, tmp_path / "first", max_steps=2)
    checkpoint_path = tmp_path / "first" / "checkpoints" / "last.ckpt"

    # The manifest: which weight serves which horizon, the head's own option, K.
    manifest = load_checkpoint(checkpoint_path)["mtp_manifest"]
    assert (manifest["head"], manifest["k"]) == ("toy", 3)
    assert manifest["head_config"]["init_gain"] == 0.5
    assert manifest["horizons"] == {"model.head.gains.0": 2, "model.head.gains.1": 3}
    assert isinstance(full.model.head, ToyHead) and full.model.head.gains[0].grad is not None

    # A checkpoint of this very experiment is accepted; the same head with another option is refused.
    _, module = _build(cfg)
    validate_checkpoint(checkpoint_path, build_manifest(module, datamodule), module)
    _, other = _build(tiny_cfg("head.name=toy", "head.k=3", "+head.init_gain=0.25"))
    with pytest.raises(ConfigError, match=r"^checkpoint: head\.init_gain differs: checkpoint has 0\.5, config has 0\.25"):
        validate_checkpoint(checkpoint_path, build_manifest(other, datamodule), other)

    # Resume: bitwise the uninterrupted run's weights.
    _, resumed, _ = fit(cfg, tmp_path / "first", max_steps=4, ckpt_path=str(checkpoint_path))
    expected = full.state_dict()
    assert all(torch.equal(value, expected[key]) for key, value in resumed.state_dict().items())

    # Export: the next-token release drops both gains and gives the full model's next-token logits;
    # --keep-heads keeps them.
    last = tmp_path / "full" / "checkpoints" / "last.ckpt"
    record = export(last, tmp_path / "release")
    assert record["removed_keys"] == ["model.head.gains.0", "model.head.gains.1"]
    batch = next(iter(datamodule.val_dataloader()))
    model = full.model.eval()
    assert torch.allclose(load_release(tmp_path / "release").next_token_logits(batch), model.next_token_logits(batch), rtol=1e-5, atol=1e-6)
    export(last, tmp_path / "release_heads", keep_heads=True)
    kept = load_release(tmp_path / "release_heads")
    assert isinstance(kept.head, ToyHead) and torch.equal(kept.head.gains[1], model.head.gains[1])


def test_toy_head_options_are_checked_once_at_build(toy_head, tiny_cfg):
    with pytest.raises(ConfigError, match=r"^head\.init_gain: must be > 0"):
        _build(tiny_cfg("head.name=toy", "head.k=2", "+head.init_gain=0"))
    with pytest.raises(ConfigError, match=r"^head\.depth: not an option of head 'toy'"):
        _build(tiny_cfg("head.name=toy", "head.k=2", "+head.depth=2"))


def _build(cfg):
    from lab.train import build

    return build(cfg)

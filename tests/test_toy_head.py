"""A new head is one class (plus a config entry): a toy head defined only here goes through
training, the checkpoint manifest, an exact resume and both exports without any other file knowing it.

ToyHead: horizon 1 is the trunk state itself; horizon k ≥ 2 is the trunk state times a learned
per-horizon gain vector `gains.{k-2}` (a container whose index i serves horizon i + 2), with an
option of its own (`init_gain`). Everything the harness must know about it is on the class.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn

from lab.checkpoint import build_manifest, load_checkpoint, validate_checkpoint
from lab.errors import ConfigError
from lab.checkpoint.export import export, load_release
from lab.model.heads import HEADS, HeadConfig, MTPHead, endpoint_horizon
from tests.fit_helpers import fit


@dataclass
class ToyConfig(HeadConfig):
    name: str = "toy"
    init_gain: float = 1.0


class ToyHead(MTPHead):
    config_class = ToyConfig
    horizon_containers = {**MTPHead.horizon_containers, "gains": 2}

    @classmethod
    def check_config(cls, cfg):
        super().check_config(cfg)
        if not cfg.init_gain > 0:
            raise ConfigError("head.init_gain", f"must be > 0, got {cfg.init_gain}")

    def __init__(self, cfg, model_cfg):
        super().__init__(cfg, model_cfg)
        self.gains = nn.ParameterList(nn.Parameter(torch.full((model_cfg.d_model,), cfg.init_gain)) for _ in range(cfg.k - 1))

    def forward(self, trunk_hidden, batch, ctx, shared):
        rows = [trunk_hidden] + [self.extra_horizon_input(trunk_hidden) * gain for gain in self.gains]  # K × [B, S, d]
        return [endpoint_horizon(k, r, batch, shared.final_norm, self.projection(k, shared)) for k, r in enumerate(rows, start=1)]


TOY = ["head.name=toy", "head.k=3", "+head.init_gain=0.5"]


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(HEADS, "toy", ToyHead)


def test_toy_head_trains_checkpoints_resumes_and_exports(toy_registered, tmp_path, tiny_cfg):
    cfg = tiny_cfg(*TOY)
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


def test_toy_head_options_are_checked_once_at_build(toy_registered, tiny_cfg):
    with pytest.raises(ConfigError, match=r"^head\.init_gain: must be > 0"):
        _build(tiny_cfg("head.name=toy", "head.k=2", "+head.init_gain=0"))
    with pytest.raises(ConfigError, match=r"^head\.depth: not an option of head 'toy'"):
        _build(tiny_cfg("head.name=toy", "head.k=2", "+head.depth=2"))


def _build(cfg):
    from lab.train import build

    return build(cfg)

"""A trunk family defined outside lab/ (docs/trunks.md, "Adding a trunk family"): the harness's GPT with its token
embeddings times a learned scalar (`embed_gain`). tests/test_toy_trunk.py registers it in the test's process;
tests/test_plugins.py installs it as a plugin (an entry point) that `lab-train` loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from lab.errors import require
from lab.nn.blocks import ModelConfig
from lab.model.trunk import Trunk
from lab.model.trunk_spec import TrunkSpec
from lab.model.trunks import check_head_on_gpt, gpt_vocab_size, preflight_gpt, trunk_layers

SCALED_YAML = """\
# `model=scaled`: the test's own trunk family (tests/test_toy_trunk.py)
defaults:
  - scaled_schema
  - _self_
name: scaled
d_model: 32
n_layers: 6
n_heads: 2
embed_gain: 2.0
"""


@dataclass
class ScaledConfig(ModelConfig):
    name: str = "scaled"
    embed_gain: float = 1.0  # the learned scale's starting value

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.embed_gain > 0, "model.embed_gain", f"must be > 0, got {self.embed_gain}")


class ScaledTrunk(Trunk):
    """The GPT with its token embeddings times a learned scalar before the first block."""

    def __init__(self, cfg: ScaledConfig, n_layers: int | None = None):
        super().__init__(cfg, n_layers)
        self.embed_gain = nn.Parameter(torch.tensor(float(cfg.embed_gain)))

    def forward(self, tokens, ctx):
        x = self.embed(tokens) * self.embed_gain  # [B, S, d]
        for block in self.blocks:
            x = block(x, ctx)
        return x  # [B, S, d], before the final norm


SCALED = TrunkSpec(
    name="scaled", config=ScaledConfig, build=lambda cfg, head_cfg: ScaledTrunk(cfg, trunk_layers(cfg, head_cfg)),
    check_head=check_head_on_gpt, preflight=preflight_gpt, fill_vocab_size=gpt_vocab_size,
    example={"name": "scaled", "vocab_size": 64, "d_model": 32, "n_layers": 4, "n_heads": 2, "embed_gain": 0.5},
)

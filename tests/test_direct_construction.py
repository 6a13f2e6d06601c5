"""A config built in Python (a benchmark's `MTPModel(...)`, a notebook's `build_model(...)`) is refused with
the same one-line error as the same value on the command line: each group's field checks run when its typed
config is constructed, a head's architecture checks when the model is, not in an opt-in step the direct
path could skip. (A float field typed by the command line's schema reads `0` as `0.0`: the cases give floats.)"""

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lab.config.checks import check_config
from lab.data import DataConfig, LMDataModule
from lab.data.synthetic.star_graph import StarGraphTask
from lab.errors import ConfigError
from lab.model.heads import DeepSeekConfig, HeadConfig
from lab.model.mtp import MTPModel, build_model
from lab.nn.blocks import ModelConfig
from lab.objective.weights import Geometric, build_weight_schedule
from lab.train import CONF_DIR
from lab.training.optim import OptimConfig
from tests.cli import TINY


def cli_error(overrides: list[str]) -> str:
    """The error line `lab-train <overrides>` prints (after `error: `), from the same composed config."""
    synthetic = "data=star_graph" in overrides  # a task has no corpus settings: TINY's data.* stay out
    tiny = [o for o in TINY if not (synthetic and o.startswith("data."))]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*tiny, *overrides, "paths.output_dir=/tmp/unused"])
    with pytest.raises(ConfigError) as refused:
        check_config(cfg)
    return str(refused.value)


def direct_error(build) -> str:
    with pytest.raises(ConfigError) as refused:
        build()
    return str(refused.value)


SMALL = {"vocab_size": 13, "d_model": 32, "n_layers": 2, "n_heads": 2}

# (command-line overrides, the same value given to a constructor in Python)
CASES = {
    "model": (["model.n_heads=3"], lambda: ModelConfig(**{**SMALL, "n_heads": 3})),
    "model_via_build_model": (["model.mlp_ratio=0"], lambda: build_model({**SMALL, "mlp_ratio": 0}, {"name": "ntp"})),
    "head_field": (["head=parallel", "head.unembedding=twice"],
                   lambda: MTPModel(ModelConfig(**SMALL), HeadConfig(name="parallel", k=4, unembedding="twice"))),
    "head_architecture": (["head.k=3"], lambda: MTPModel(ModelConfig(**SMALL), HeadConfig(name="ntp", k=3))),  # ntp's own check
    "deepseek_depth": (["head=deepseek", "head.depth=0"], lambda: MTPModel(ModelConfig(**SMALL), DeepSeekConfig(depth=0))),
    "optim": (["optim.grad_clip=-1"], lambda: OptimConfig(grad_clip=-1.0)),
    "data": (["data.batch_size=0"], lambda: DataConfig(batch_size=0)),
    "data_module": (["data.val_fraction=1.5"], lambda: LMDataModule(val_fraction=1.5)),
    "synthetic_task": (["data=star_graph", "data.degree=1"], lambda: StarGraphTask(degree=1)),
    "weights": (["head=parallel", "weights=geometric", "weights.gamma=0"], lambda: Geometric(k=4, gamma=0.0)),
    "weights_by_name": (["head=parallel", "weights=medusa", "weights.base=-1"],
                        lambda: build_weight_schedule("medusa", 4, base=-1.0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_direct_construction_raises_the_command_lines_error(case):
    overrides, build = CASES[case]
    expected = cli_error(overrides)
    assert direct_error(build) == expected


def test_a_valid_direct_construction_builds():
    """The checks refuse only what the command line refuses: the defaults and a DeepSeek depth build."""
    model = MTPModel(ModelConfig(**SMALL), DeepSeekConfig(depth=1))
    assert (model.head_cfg.k, model.head_cfg.depth) == (2, 1)
    assert OptimConfig() == OptimConfig(**OmegaConf.to_container(OmegaConf.structured(OptimConfig)))

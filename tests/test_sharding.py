"""`trainer=fsdp`: Lightning's FSDPStrategy with one FSDP unit per transformer block.

FSDP cannot run on CPU: Lightning 2.6 refuses the strategy without a GPU accelerator, and
torch's FullyShardedDataParallel itself needs a non-CPU device. So the CPU tests check the
composed strategy and run torch's own wrap policy over every head architecture in-process;
the sharded training run itself is exercised only on GPUs (experiments/benchmarks/gpu_throughput.py
and `lab-train trainer=fsdp`).
"""

import pytest
import pytorch_lightning as pl
import torch.nn as nn
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from pytorch_lightning.strategies import FSDPStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from lab.model.heads import sharding_units
from lab.model.heads.deepseek import DepthModule
from lab.nn.blocks import Block
from lab.train import CONF_DIR
from tests.head_cases import case, without
from tests.helpers import build_model

# Every registered head and variants, but medusa: its residual `head.blocks` are linear layers that stay in
# the root, which the check on root parameter names below cannot tell from a leaked transformer block.
HEADS = {
    **without("medusa"),
    "linear_replicated": case("linear", unembedding="replicated"),
    "causal": case("causal", n_layers=2),
    "anticausal": case("anticausal", compute_match="none"),
    "parallel_copy_last_block": case("parallel", init="copy_last_block"),
    "deepseek_shared": case("deepseek", share_depth_weights=True),
}


def trainer_config(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=list(overrides)).trainer


def test_fsdp_preset_builds_lightnings_strategy_with_block_units():
    cfg = trainer_config("trainer=fsdp")
    assert cfg.accelerator == "gpu" and cfg.precision == "bf16-mixed" and cfg.deterministic is False
    strategy = instantiate(cfg.strategy)
    assert type(strategy) is FSDPStrategy
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy) and set(policy._module_classes) == {Block, DepthModule}
    assert strategy._state_dict_type == "full"  # one consolidated file on rank 0: manifest and exact resume as on one device
    assert instantiate(trainer_config("trainer=fsdp", "trainer.strategy.activation_checkpointing=true").strategy)._activation_checkpointing_kwargs


def test_lightning_refuses_fsdp_on_cpu():
    """If Lightning ever allows it, this fails: then replace the in-process policy test by a 2-process gloo run."""
    with pytest.raises(ValueError, match="requires a GPU accelerator"):
        pl.Trainer(accelerator="cpu", devices=1, strategy=instantiate(trainer_config("trainer=fsdp").strategy), logger=False)


def units_of(model: nn.Module) -> list[nn.Module]:
    """The modules torch's FSDP wrap policy turns into units (the root excluded)."""
    policy = ModuleWrapPolicy(sharding_units())
    return [m for m in policy._run_policy(model, ignored_modules=set(), root_kwargs={}) if m is not model]


def own_parameters(unit: nn.Module, units: list[nn.Module]) -> set[int]:
    """Parameters the unit owns itself: not those of a nested unit."""
    nested = {id(p) for other in units if other is not unit and any(other is m for m in unit.modules()) for p in other.parameters()}
    return {id(p) for p in unit.parameters()} - nested


@pytest.mark.parametrize("head", list(HEADS))
def test_every_transformer_block_is_one_unit_and_shared_weights_stay_in_the_root(head):
    model = build_model(**HEADS[head], layers=4)
    units = units_of(model)
    blocks = [m for m in model.modules() if isinstance(m, Block)]
    depths = [m for m in model.modules() if isinstance(m, DepthModule)]
    assert len({id(u) for u in units}) == len(units) == len(blocks) + len(depths)
    assert {id(u) for u in units} == {id(m) for m in blocks + depths}
    assert len(blocks) == len(model.trunk.blocks) + sum(1 for m in model.head.modules() if isinstance(m, Block))
    if head == "deepseek":
        assert len(depths) == 2
    if head == "deepseek_shared":
        assert len(depths) == 1  # one module reused at every depth: one unit
    # FSDP flattens each unit's own parameters: a Parameter may belong to one unit only, and
    # the embedding (= tied unembedding) and final norm, which the objective uses outside
    # any block's forward, must stay in the root (gathered from forward to backward).
    owned = [own_parameters(u, units) for u in units]
    assert owned and sum(len(o) for o in owned) == len(set().union(*owned))
    root_only = {id(model.trunk.embed.weight), id(model.trunk.final_norm.weight)}
    assert not root_only & set().union(*owned)
    in_units = set().union(*owned)
    root_params = [n for n, p in model.named_parameters() if id(p) not in in_units]
    assert all(n.startswith(("trunk.embed", "trunk.final_norm", "trunk.unembed", "head.")) for n in root_params), root_params
    assert not any(".block." in n or ".blocks." in n for n in root_params), root_params


def optimizer_groups(module) -> list[set[int]]:
    optimizer = module.configure_optimizers()["optimizer"]
    return [{id(p) for p in group["params"]} for group in optimizer.param_groups]


def test_weight_decay_groups_survive_fsdp_flattening_parameters(cache_dir):
    """Under FSDP (use_orig_params) configure_optimizers sees every Parameter as a 1-D shard view;
    matrices must still decay. Flatten each Parameter's data as FSDP does and rebuild the optimizer."""
    from lab.train import build
    from tests.fit_helpers import compose_cfg

    _, module = build(compose_cfg("head=deepseek", "head.depth=2", cache_dir=cache_dir))
    decay, no_decay = optimizer_groups(module)
    matrices = {id(p) for p in module.model.parameters() if p.dim() >= 2}
    assert decay == matrices and no_decay and not decay & no_decay
    for param in module.model.parameters():
        param.data = param.data.reshape(-1)  # this rank's shard of the flat parameter: 1-D
    assert optimizer_groups(module) == [decay, no_decay]

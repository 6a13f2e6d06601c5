"""FSDP sharding units for Lightning's FSDPStrategy (`trainer=fsdp`).

Every transformer block is one FSDP unit: the trunk's blocks, the blocks of each head's
stack (parallel / causal / anticausal heads are stacks of the trunk's `Block`), and each
DeepSeek depth module (its 2d→d projection and norms, with its block as a nested unit).
Everything else — embedding (= tied unembedding), final norm, linear heads — stays in the
root unit, whose parameters remain gathered from the forward to the backward, so the
objective can project head rows through them outside any block's forward.
"""

from __future__ import annotations


from lab.model.heads import sharding_units  # head-owned: each head class names its units
from lab.nn.blocks import Block
from lab.training.master_weights import gather_master_grads


def fsdp_strategy(*, activation_checkpointing: bool = False, **options):
    """Lightning's FSDPStrategy wrapping every module in `sharding_units()`; `options` go to it unchanged."""
    from pytorch_lightning.strategies import FSDPStrategy

    checkpointing = {Block} if activation_checkpointing else None  # blocks only: a depth module holds one
    return FSDPStrategy(auto_wrap_policy=set(sharding_units()), activation_checkpointing_policy=checkpointing, **options)


def clip_gradient_norm(module, optimizer, max_norm: float | None) -> None:
    """Clip the global gradient norm to `max_norm` (None: no clipping).

    Lightning's `clip_gradients` everywhere except under FSDP, whose precision plugin refuses
    clipping by norm: there the sharded root's own `clip_grad_norm_` computes the norm over
    all shards (torch.nn.utils.clip_grad_norm_ would see this rank's shard only).
    """
    if max_norm is None:
        return
    from pytorch_lightning.strategies import FSDPStrategy

    strategy = module.trainer.strategy
    if isinstance(strategy, FSDPStrategy):
        strategy.model.clip_grad_norm_(max_norm)  # the model's grads: the optimizer's step gathers them afterwards
    else:
        gather_master_grads(optimizer)  # bf16 Parameters: Lightning clips the optimizer's float32 masters
        module.clip_gradients(optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")

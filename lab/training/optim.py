"""AdamW with linear warm-up and cosine decay: the `optim` config group as one typed object."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from lab.errors import is_number, require, require_int, require_number
from lab.training.master_weights import MasterWeightAdamW


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0  # max global gradient norm; None: no clipping
    head_lr_multiplier: float = 1.0  # the head's own Parameters learn at lr × this (Medusa-2 uses 4)

    def __post_init__(self) -> None:
        # torch would refuse these only once fit starts, after the run folder is made.
        require_number(self.lr, "optim.lr", low=0, open_low=True)
        betas = list(self.betas) if isinstance(self.betas, (list, tuple)) else [self.betas]
        require(len(betas) == 2 and all(is_number(b) and 0 <= b < 1 for b in betas), "optim.betas",
                f"must be two numbers in [0, 1), e.g. [0.9, 0.95], got {betas}")
        require_number(self.weight_decay, "optim.weight_decay", low=0)
        # These four were clamped or taken as they came (a negative clip norm flips every gradient's sign).
        require_int(self.warmup_steps, "optim.warmup_steps", least=0)
        require(self.grad_clip is None or (is_number(self.grad_clip) and self.grad_clip > 0), "optim.grad_clip",
                f"must be a number > 0 (the largest gradient norm) or null (no clipping), got {self.grad_clip!r}")
        require(is_number(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio",
                f"must be a number in [0, 1] (the final lr as a share of optim.lr), got {self.min_lr_ratio!r}")
        require_number(self.head_lr_multiplier, "optim.head_lr_multiplier", low=0, open_low=True)
        object.__setattr__(self, "betas", tuple(betas))


def matrix_parameters(model: torch.nn.Module) -> set[int]:
    """ids of the ≥ 2-D Parameters (the ones that decay), taken before any wrapping.

    FSDP (`use_orig_params=True`, Lightning's default) keeps the Parameter objects but turns
    each one's data into a 1-D view of this rank's shard before `configure_optimizers`
    runs, so `p.dim()` read then would put every matrix into the no-decay group.
    """
    return {id(p) for p in model.parameters() if p.dim() >= 2}


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, total_steps: int, matrices: set[int] | None = None):
    """(AdamW, LambdaLR stepped once per optimizer step) over the trainable Parameters; matrices decay, vectors do not.
    Low-precision Parameters get float32 master weights (MasterWeightAdamW).

    `matrices`: `matrix_parameters(model)` taken before the model was wrapped (default: now).
    """
    matrices = matrix_parameters(model) if matrices is None else matrices
    trainable = [p for p in model.parameters() if p.requires_grad]  # a frozen trunk gets no optimizer state
    # With multiplier 1 the two groups of old checkpoints (decay, no decay) stay exactly as they were.
    head = {id(p) for p in model.head.parameters()} if hasattr(model, "head") and cfg.head_lr_multiplier != 1 else set()
    groups = []
    for owner_lr, owned in ((cfg.lr, [p for p in trainable if id(p) not in head]),
                            (cfg.lr * cfg.head_lr_multiplier, [p for p in trainable if id(p) in head])):
        decay = [p for p in owned if id(p) in matrices]
        no_decay = [p for p in owned if id(p) not in matrices]
        groups += [{"params": decay, "weight_decay": cfg.weight_decay, "lr": owner_lr}, {"params": no_decay, "weight_decay": 0.0, "lr": owner_lr}]
    groups = groups[:2] + [group for group in groups[2:] if group["params"]]
    # bf16 / fp16 Parameters are updated through float32 masters (lab/training/master_weights.py); float32 ones as by AdamW
    optimizer = MasterWeightAdamW(groups, lr=cfg.lr, betas=cfg.betas)
    warmup = max(1, int(cfg.warmup_steps))
    floor = cfg.min_lr_ratio

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)

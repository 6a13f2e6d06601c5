"""AdamW with float32 master weights for low-precision (bf16 / fp16) Parameters.

Why: a bf16 number keeps 8 significant bits, so an update smaller than half a unit in the last
place of the weight is rounded away. A norm gain at 1.0 has a bf16 ulp of 2^-7 ≈ 0.0078: every
Adam step below 0.0039 leaves it exactly 1.0, i.e. at lr 3e-4 it never moves. The fix every
mixed-precision trainer applies:

    master_p  (float32, owned by the optimizer)        w_bf16 = round_bf16(master_p)
    grad      : master_p.grad = float32(w_bf16.grad)   (after backward, before clipping)
    update    : AdamW on master_p                      (moments in float32 too)
    write back: w_bf16 ← round_bf16(master_p)          (the forward and caches stay bf16)

Small steps accumulate in master_p until they cross a bf16 rounding boundary. Float32 (and
float64) Parameters are their own masters: for a float32 model this optimizer is plain AdamW,
step for step and in its state_dict (old checkpoints load unchanged). The masters travel in the
state_dict (`master_weights`), so a resumed bf16 run continues from the full-precision values.
"""

from __future__ import annotations

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)
MASTER_KEY = "master_weights"  # the state_dict entry holding the float32 masters, in slot order


class MasterWeightAdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` over float32 masters of the low-precision Parameters in `groups`.

    `param_groups` hold the masters (what the LR scheduler and gradient clipping act on);
    `model_parameter(master)` maps each back to the Parameter the model computes with.
    """

    def __init__(self, groups: list[dict], **options):
        self.pairs: list[tuple[torch.nn.Parameter, torch.Tensor]] = []  # (model Parameter, its float32 master)
        master_groups = [{**group, "params": [self._master_of(p) for p in group["params"]]} for group in groups]
        super().__init__(master_groups, **options)
        self._model_of = {id(master): p for p, master in self.pairs}
        self._grads_gathered = False

    def _master_of(self, parameter: torch.nn.Parameter) -> torch.Tensor:
        if parameter.dtype not in LOW_PRECISION:
            return parameter
        master = parameter.detach().to(torch.float32).requires_grad_(True)  # a leaf the optimizer owns
        self.pairs.append((parameter, master))
        return master

    def model_parameter(self, tensor: torch.Tensor) -> torch.Tensor:
        """The model Parameter a bound tensor stands for (itself unless it is a master)."""
        return self._model_of.get(id(tensor), tensor)

    def gather_grads(self) -> None:
        """master.grad ← float32(model grad). Call before clipping so the norm is taken in float32; step() calls it
        itself when nothing did."""
        for parameter, master in self.pairs:
            master.grad = None if parameter.grad is None else parameter.grad.detach().to(torch.float32)
        self._grads_gathered = True

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._grads_gathered:
            self.gather_grads()
        super().step()
        self._grads_gathered = False
        for parameter, master in self.pairs:
            parameter.copy_(master)  # round to nearest bf16: the model computes with the updated value
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)  # the masters' grads
        for parameter, _ in self.pairs:
            if set_to_none:
                parameter.grad = None
            elif parameter.grad is not None:
                parameter.grad.zero_()
        self._grads_gathered = False

    def state_dict(self) -> dict:
        state = super().state_dict()
        state[MASTER_KEY] = [master.detach().clone() for _, master in self.pairs]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        masters = state_dict.pop(MASTER_KEY, None)
        super().load_state_dict(state_dict)
        if masters is None:  # a checkpoint written before master weights: start them from the loaded model weights
            masters = [parameter.detach() for parameter, _ in self.pairs]
        if len(masters) != len(self.pairs) or any(saved.shape != master.shape for saved, (_, master) in zip(masters, self.pairs)):
            raise ValueError(f"the checkpoint's {len(masters)} master weights do not match this model's {len(self.pairs)} "
                             "low-precision trainable Parameters (was it written for another model or dtype?)")
        with torch.no_grad():
            for saved, (parameter, master) in zip(masters, self.pairs):
                master.copy_(saved)
                parameter.copy_(master)


def gather_master_grads(optimizer) -> None:
    """Before clipping: the masters' float32 grads (a no-op for an optimizer without masters)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # Lightning wraps the optimizer in a LightningOptimizer
    if isinstance(inner, MasterWeightAdamW):
        inner.gather_grads()


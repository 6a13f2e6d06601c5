"""The one check of the weights every loading path reads: a training checkpoint (ckpt_path, init_from, lab-generate,
lab-export), the harness's own release, every release layout (DeepSeek, Medusa: lab/release/), a `model=hf` folder and
the folder a GGUF converts to. What the harness trains and writes is float weights with finite values, so a tensor
stored in a quantised dtype (int8, uint8, float8, float4: a cast without its scales) or holding NaN / inf is refused in
one line naming the tensor and the file, before anything loads it into a model.

It sits with the model (below lab/checkpoint and lab/release) because the `model=hf` trunk reads folders itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from lab.errors import ConfigError

# The one set of quantised dtypes, by torch's names (those this torch lacks are left out).
QUANTISED = tuple(getattr(torch, name) for name in ("int8", "uint8", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                      "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2") if hasattr(torch, name))


def check_weights(tensors: Mapping[str, object], field: str, source: str) -> None:
    """Refuse the first quantised or non-finite tensor of `tensors` (name → tensor; other values are skipped)."""
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        if tensor.dtype in QUANTISED:
            raise ConfigError(field, f"{source}: tensor {name} is stored as {str(tensor.dtype).removeprefix('torch.')}, a quantised dtype "
                                     "(the harness writes float weights; a cast without its scales changes the model)")
        if tensor.is_floating_point() and tensor.numel() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ConfigError(field, f"{source}: tensor {name} holds {bad} non-finite value{'s' if bad > 1 else ''} (NaN or inf) "
                                     f"of {tensor.numel()}")


def check_weight_file(path: Path, field: str) -> None:
    """`check_weights` on every tensor of the safetensors file `path`, one tensor in memory at a time (a folder's
    weights are then read by transformers or a layout's reader: they need not fit in memory twice)."""
    from safetensors import safe_open

    with safe_open(path, "pt") as handle:
        for key in handle.keys():
            check_weights({key: handle.get_tensor(key)}, field, str(path))

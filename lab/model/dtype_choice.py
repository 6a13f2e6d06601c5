"""`model.dtype=auto`: bfloat16 where the hardware computes it natively, float32 elsewhere.

On a CPU without bf16 instructions torch emulates bf16 matmuls through float32 conversions, which
is slower than float32 itself (measured on an AVX2-only EPYC, one thread: F.linear 576→1536 is
1.8-6x slower in bf16 at 1-256 rows; a SmolLM2-135M forward 36 vs 203 tokens/s). So `auto` takes
bfloat16 only on a CUDA device that supports it or a CPU with AVX-512 BF16 or AMX tiles, and says
which it chose and why. `torch.backends.cpu.get_cpu_capability()` names only the vector ISA torch
dispatches to (DEFAULT, AVX2, AVX512, ...), never BF16 or AMX, so the bf16 probes are torch.cpu's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

AUTO = "auto"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DTYPE_SETTINGS = (AUTO, *DTYPES)  # model.dtype's allowed values (model=hf)


@dataclass(frozen=True)
class DtypeChoice:
    name: str  # a key of DTYPES
    reason: str  # what decided it, for the console line and run.json


def cuda_has_bf16() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def cpu_bf16_features() -> list[str]:
    """The native bf16 features of this CPU, as torch.cpu probes them (empty: bf16 would be emulated)."""
    probes = {"AVX512_BF16": "_is_avx512_bf16_supported", "AMX": "_is_amx_tile_supported"}
    return [feature for feature, probe in probes.items() if getattr(torch.cpu, probe, lambda: False)()]


def resolve_dtype(setting: str) -> DtypeChoice:
    """The dtype a `model.dtype` setting names; `auto` decides from the hardware."""
    if setting != AUTO:
        return DtypeChoice(setting, "set in model.dtype")
    if cuda_has_bf16():
        return DtypeChoice("bfloat16", f"CUDA device {torch.cuda.get_device_name()} supports bf16")
    features = cpu_bf16_features()
    if features:
        return DtypeChoice("bfloat16", f"this CPU computes bf16 natively ({', '.join(features)})")
    capability = torch.backends.cpu.get_cpu_capability()
    return DtypeChoice("float32", f"no CUDA bf16 and this CPU ({capability}) has neither AVX512_BF16 nor AMX: bf16 would be emulated, "
                                  "slower than float32")

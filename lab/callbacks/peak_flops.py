"""Peak dense bf16 tensor-core FLOP/s per device, the denominator of MFU.

`callbacks.throughput.peak_flops` takes a name from PEAK_BF16_FLOPS, a number (FLOP/s per
device) or `auto` (the CUDA device's name, matched against the table; nothing on CPU or an
unknown device, and then `train/mfu` is not logged). Vendor datasheet values without
sparsity; MFU is always against the bf16 peak, whatever `trainer.precision` is.
"""

from __future__ import annotations

import torch

from lab.errors import ConfigError, is_number

PEAK_BF16_FLOPS = {
    "H200": 989.4e12,  # SXM; same tensor cores as H100 SXM
    "H100": 989.4e12,  # SXM
    "H100-PCIe": 756.0e12,
    "A100": 312.0e12,  # SXM and PCIe
}
# Substrings of torch.cuda.get_device_name(), most specific first.
DEVICE_NAME_PATTERNS = (("H200", "H200"), ("H100 PCIe", "H100-PCIe"), ("H100", "H100"), ("A100", "A100"))


def peak_name_of(device_name: str) -> str | None:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; None for a device not in the table."""
    return next((peak for pattern, peak in DEVICE_NAME_PATTERNS if pattern in device_name), None)


def device_peak_name(device: torch.device) -> str | None:
    return peak_name_of(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def resolve_peak_flops(spec, device: torch.device) -> float | None:
    """FLOP/s of one device for `spec` (name, number, `auto` or None)."""
    if spec is None or spec == "auto":
        name = device_peak_name(device)
        return None if name is None else PEAK_BF16_FLOPS[name]
    if is_number(spec):
        if spec > 0:
            return float(spec)
    elif spec in PEAK_BF16_FLOPS:
        return PEAK_BF16_FLOPS[spec]
    raise ConfigError("callbacks.throughput.peak_flops", f"unknown {spec!r}; allowed: auto, a number of FLOP/s > 0, {', '.join(PEAK_BF16_FLOPS)}")

"""RNG state in checkpoints: torch, numpy and python generators as weights_only-safe values."""

from __future__ import annotations

import random

import numpy as np
import torch

# -------------------------------------------------------------------------- RNG state


def collect_rng_states() -> dict:
    """torch, numpy and python RNG states as tensors, ints and tuples (weights_only-safe)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    numpy = states["numpy"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state((numpy["name"], keys, numpy["pos"], numpy["has_gauss"], numpy["gauss"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])

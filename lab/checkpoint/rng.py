"""RNG state in checkpoints: torch, numpy and python generators as weights_only-safe values."""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.distributed as dist

from lab.errors import require

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


def collect_rng_states_of_every_rank() -> list[dict]:
    """Every rank's `collect_rng_states()`, in rank order: an all-gather under DDP (every rank
    calls this while Lightning dumps a checkpoint; rank 0 writes the file), else [this process's]."""
    states = collect_rng_states()
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [states]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, states)
    return gathered


def rng_states_for_rank(saved: dict, rank: int, world_size: int) -> dict | None:
    """This rank's saved RNG states (`mtp_state`); refuses a checkpoint written by another number of ranks."""
    by_rank = saved.get("rng_by_rank")
    if by_rank is None:  # written before per-rank states were saved: rank 0's for everyone
        return saved.get("rng")
    require(
        len(by_rank) == world_size,
        "trainer.devices",
        f"the checkpoint was written by {len(by_rank)} process(es), this run has {world_size}; resume with the same number",
    )
    return by_rank[rank]


def restore_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    numpy = states["numpy"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state((numpy["name"], keys, numpy["pos"], numpy["has_gauss"], numpy["gauss"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])

"""Training FLOPs per token, counted by torch's FlopCounterMode on a meta-device copy.

`counted_training_flops_per_token(model, seq_len)` has the interface MFU needs —
`(MTPModel, seq_len) -> float`, forward + backward matmul FLOPs per token — and counts
what the network actually runs: one `seq_len`-token sequence through trunk and head, then
every horizon's projection to the vocabulary over all its S-k rows (the dense work; masked
rows are not skipped by the hardware either). The backward is taken as 2 × the forward.
Nothing is allocated: the copy lives on the `meta` device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

BACKWARD_OVER_FORWARD = 2


def one_sequence_batch(seq_len: int, device) -> dict:
    """One fully active document of `seq_len` tokens."""
    positions = torch.arange(seq_len, device=device)[None]  # [1, S]
    return {
        "tokens": torch.zeros(1, seq_len, dtype=torch.long, device=device),
        "active": torch.ones(1, seq_len, dtype=torch.bool, device=device),
        "segment_ids": torch.zeros(1, seq_len, dtype=torch.long, device=device),
        "position_ids": positions,
    }


def counted_forward_flops(model, seq_len: int) -> int:
    """Forward FLOPs of trunk, head and the K vocabulary projections for one sequence."""
    with torch.device("meta"):
        twin = type(model)(model.model_cfg, model.head_cfg)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        for horizon in twin(one_sequence_batch(seq_len, "meta")):
            F.linear(horizon.norm(horizon.hidden), horizon.weight)  # [1, S-k, V]
    return counter.get_total_flops()


def counted_training_flops_per_token(model, seq_len: int) -> float:
    return (1 + BACKWARD_OVER_FORWARD) * counted_forward_flops(model, seq_len) / seq_len

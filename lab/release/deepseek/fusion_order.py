"""The fusion order of a DeepSeek MTP layer: which half of eh_proj's 2d input columns takes the embedding.

`he`: [hidden, embedding]; `eh`: [embedding, hidden]. A weight is only ever moved between the two orders by
swapping its column blocks (both orders declared), never reinterpreted; what a folder holds is the order
transformers' MtpLayer runs for its family.
"""

from __future__ import annotations

import torch

from lab.errors import require


def runtime_fusion_order(hf_config) -> str:
    """What transformers' MtpLayer concatenates: [hidden, embedding] under `mtp_hidden_states_first`, else [embedding, hidden]."""
    return "he" if getattr(hf_config.get_text_config(), "mtp_hidden_states_first", False) else "eh"


def swap_fusion_columns(weight: torch.Tensor) -> torch.Tensor:
    """[d, 2d] → [d, 2d] with the two d-wide column blocks exchanged (he ↔ eh)."""
    d = weight.shape[0]
    require(tuple(weight.shape) == (d, 2 * d), "eh_proj", f"fusion weight must have shape [d, 2d], got {tuple(weight.shape)}")
    return torch.cat([weight[:, d:], weight[:, :d]], dim=-1)  # [d, 2d]


def projection_in_order(weight: torch.Tensor, have: str, want: str) -> torch.Tensor:
    """The 2d→d projection with its columns in order `want`, from columns in order `have` (both declared)."""
    for name, order in (("have", have), ("want", want)):
        require(order in ("he", "eh"), "mtp_fusion_order", f"declare the fusion order: he or eh (got {order!r} for {name})")
    return weight if have == want else swap_fusion_columns(weight)

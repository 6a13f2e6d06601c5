"""What one decoding request gives back (`Generation`) and the checks every request passes first."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lab.errors import require


@dataclass
class Generation:
    tokens: list[int]  # new tokens only, up to and including EOS
    stats: dict = field(default_factory=dict)


def check_request(model, prompt: torch.Tensor, max_new_tokens: int, temperature: float, top_k, draft_steps) -> None:
    vocab = model.model_cfg.vocab_size
    require(prompt.dim() == 1 and prompt.numel() >= 1, "prompt", f"must be a non-empty 1-D LongTensor of token ids, got shape {tuple(prompt.shape)}")
    require(not prompt.is_floating_point() and not prompt.is_complex(), "prompt", f"must hold integer token ids, got {prompt.dtype}")
    require(bool(((prompt >= 0) & (prompt < vocab)).all()), "prompt", f"token ids must lie in [0, {vocab})")
    require(isinstance(max_new_tokens, int) and max_new_tokens >= 0, "max_new_tokens", f"must be an int ≥ 0, got {max_new_tokens!r}")
    require(temperature >= 0, "temperature", f"must be ≥ 0 (0 = greedy), got {temperature}")
    require(top_k is None or (isinstance(top_k, int) and top_k >= 1), "top_k", f"must be None or an int ≥ 1, got {top_k!r}")
    require(draft_steps is None or (isinstance(draft_steps, int) and draft_steps >= 1), "draft_steps", f"must be None or an int ≥ 1, got {draft_steps!r}")

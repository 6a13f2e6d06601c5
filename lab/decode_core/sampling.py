"""Token choice: greedy argmax, or sampling from softmax(logits / T) restricted to the top k.

Distributions are float64 whatever the model's dtype, so the speculative acceptance
ratios and residuals are computed once, accurately, from the same numbers that sampling uses.
"""

from __future__ import annotations

import torch


def distribution(logits: torch.Tensor, temperature: float, top_k: int | None = None) -> torch.Tensor:
    """[..., V] logits -> [..., V] float64 probabilities of softmax(logits / T) over the top k."""
    scaled = logits.to(torch.float64) / temperature  # [..., V]
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]  # [..., 1]: the k-th largest
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))  # ties with the k-th stay in
    return scaled.softmax(dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from a [V] distribution, by inverting its CDF at one uniform.

    torch.multinomial draws one exponential per vocabulary entry (0.86 ms for V = 49,152 in float64 on one
    CPU thread, most of a T = 1 tree round's host time); a cumulative sum and a binary search give the
    same law for one uniform. `right=True` never lands on a zero-probability id inside the CDF (a flat
    run of equal values is skipped); u · total rounding up to the total falls back to the last id with mass.
    """
    cdf = probs.cumsum(-1)  # [V]
    point = uniform(generator) * float(cdf[-1])
    token = int(torch.searchsorted(cdf, torch.tensor([point], dtype=cdf.dtype), right=True)[0])
    if token >= probs.shape[-1] or not probs[token] > 0:
        token = int(probs.nonzero()[-1, 0])
    return token


def uniform(generator: torch.Generator | None) -> float:
    return float(torch.rand((), dtype=torch.float64, generator=generator).item())


class TorchDraws:
    """The decoder's randomness, all from one torch.Generator: categorical draws and acceptance coins.

    Every random choice of decoding goes through `sample` or `accept`, so a test can swap in
    a source that enumerates every outcome with its probability (tests/test_decode_law.py).
    """

    def __init__(self, generator: torch.Generator | None):
        self.generator = generator

    def sample(self, probs: torch.Tensor) -> int:
        return sample(probs, self.generator)

    def accept(self, probability: float) -> bool:
        """True with `probability` (a uniform u in [0, 1) is drawn even when the answer is sure)."""
        return uniform(self.generator) < probability


class TokenChooser:
    """Greedy when temperature == 0, else sampling; `choose` returns (token, its distribution or None)."""

    def __init__(self, temperature: float, top_k: int | None, generator: torch.Generator | None, draws=None):
        self.temperature, self.top_k, self.generator = temperature, top_k, generator
        self.draws = TorchDraws(generator) if draws is None else draws

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return distribution(logits, self.temperature, self.top_k)

    def choose(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """[V] logits -> (token, [V] float64 distribution it was drawn from; None when greedy)."""
        if self.greedy:
            return int(logits.argmax().item()), None
        probs = self.probs(logits)
        return self.draws.sample(probs), probs

"""Reduction policies: how per-horizon loss sums become one scalar loss.

Each horizon k yields a loss sum S_k (token cross-entropies over its valid rows)
and a count N_k. A policy maps the counts (and the loss weights λ) to one
coefficient c_k per horizon; the loss is Σ_k c_k S_k (docs/api.md).

Coefficients depend on counts alone, so they are exact under data parallelism
once the counts are all-reduced. They carry no gradient: only S_k does.
A coefficient whose denominator is 0 is 0, so an empty horizon contributes
nothing and never produces NaN or inf.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from lab.errors import is_number, require

# A policy sees float64 counts N, float64 lambdas λ and the fixed denominator T
# (None for policies that do not use it).
CoefficientFn = Callable[[Tensor, Tensor, "float | None"], Tensor]


def _safe_divide(numerator: Tensor, denominator: Tensor) -> Tensor:
    """numerator / denominator, and 0 wherever the denominator is 0."""
    nonzero = denominator != 0
    # Divide by 1 where the denominator is 0 so no inf/NaN is ever formed.
    quotient = numerator / torch.where(nonzero, denominator, torch.ones_like(denominator))
    return torch.where(nonzero, quotient, torch.zeros_like(quotient))


def _sum(counts: Tensor, lambdas: Tensor, fixed_denominator: float | None) -> Tensor:
    return lambdas.clone()


def _global(counts: Tensor, lambdas: Tensor, fixed_denominator: float | None) -> Tensor:
    return _safe_divide(lambdas, counts.sum().expand_as(lambdas))


def _weighted_pair(counts: Tensor, lambdas: Tensor, fixed_denominator: float | None) -> Tensor:
    return _safe_divide(lambdas, (lambdas * counts).sum().expand_as(lambdas))


def _head_mean(counts: Tensor, lambdas: Tensor, fixed_denominator: float | None) -> Tensor:
    return _safe_divide(lambdas, counts)


def _fixed(counts: Tensor, lambdas: Tensor, fixed_denominator: float | None) -> Tensor:
    # T > 0 is guaranteed by validation, so a plain division is safe.
    return lambdas / fixed_denominator


def _main_denominator(counts: Tensor, lambdas: Tensor, fixed_denominator: float | None) -> Tensor:
    return _safe_divide(lambdas, counts[0].expand_as(lambdas))


def _deepseek_paper(counts: Tensor, lambdas: Tensor, fixed_denominator: float | None) -> Tensor:
    # The main objective is a valid-row mean; the extra depths use the paper's 1/T.
    main = _head_mean(counts[:1], lambdas[:1], fixed_denominator)
    extra = _fixed(counts[1:], lambdas[1:], fixed_denominator)
    return torch.cat([main, extra])


POLICIES: dict[str, CoefficientFn] = {
    "sum": _sum,
    "global": _global,
    "weighted_pair": _weighted_pair,
    "head_mean": _head_mean,
    "fixed": _fixed,
    "main_denominator": _main_denominator,
    "deepseek_paper": _deepseek_paper,
}

# Policies whose formula contains T; the others ignore fixed_denominator.
NEEDS_FIXED_DENOMINATOR: frozenset[str] = frozenset({"fixed", "deepseek_paper"})


def _require_known_policy(policy: str) -> None:
    require(
        policy in POLICIES,
        "reduction.policy",
        f"unknown {policy!r}; allowed: {', '.join(POLICIES)}",
    )


def _require_fixed_denominator(policy: str, fixed_denominator: float | Tensor | None, *, resolved: bool) -> None:
    """T, where given, is a finite number > 0; once `resolved` (T = token positions filled in), a policy that uses T needs one."""
    if fixed_denominator is None and not (resolved and policy in NEEDS_FIXED_DENOMINATOR):
        return
    value = fixed_denominator.item() if isinstance(fixed_denominator, Tensor) and fixed_denominator.numel() == 1 else fixed_denominator
    valid = is_number(value) and value > 0
    require(
        valid,
        "reduction.fixed_denominator",
        f"policy {policy!r} needs a finite number > 0 (token positions per batch), got {fixed_denominator!r}",
    )


def validate_reduction(policy: str, fixed_denominator: float | Tensor | None = None, *, resolved: bool = True) -> None:
    """The `reduction` group's one check: the policy exists and T, if set, is a finite number > 0.

    `resolved=False` (the config, where null means "token positions in the batch, per step")
    accepts a missing T; at a step (`resolved=True`) a policy that uses T must have one."""
    _require_known_policy(policy)
    _require_fixed_denominator(policy, fixed_denominator, resolved=resolved)


def _result_dtype(lambdas: Tensor | Sequence[float]) -> torch.dtype:
    if isinstance(lambdas, Tensor) and lambdas.is_floating_point():
        return lambdas.dtype
    return torch.float64


def _device_of(*values: object) -> torch.device:
    for value in values:
        if isinstance(value, Tensor):
            return value.device
    return torch.device("cpu")


def _as_float64_vector(values: Tensor | Sequence[float], device: torch.device, field: str) -> Tensor:
    vector = torch.as_tensor(values, dtype=torch.float64, device=device)
    require(vector.dim() == 1, field, f"must be a 1-D sequence, got shape {tuple(vector.shape)}")
    return vector


def coefficients(
    policy: str,
    counts: Tensor | Sequence[int],
    lambdas: Tensor | Sequence[float],
    *,
    fixed_denominator: float | Tensor | None = None,
) -> Tensor:
    """Per-horizon coefficients c_k of `policy` (docs/api.md), shape [K].

    Computed in float64 (counts up to 2^53 are exact), then returned in the dtype
    of `lambdas` if it is a floating tensor, else float64; on the device of
    `lambdas` (or of `counts`) when either is a tensor.
    """
    validate_reduction(policy, fixed_denominator)
    device = _device_of(lambdas, counts)
    counts64 = _as_float64_vector(counts, device, "reduction.counts")
    lambdas64 = _as_float64_vector(lambdas, device, "weights.lambdas")
    require(
        lambdas64.numel() == counts64.numel(),
        "weights.lambdas",
        f"has {lambdas64.numel()} entries but there are {counts64.numel()} horizons",
    )
    denominator = None if fixed_denominator is None else float(fixed_denominator)
    return POLICIES[policy](counts64, lambdas64, denominator).to(_result_dtype(lambdas))


def reduced_loss(coeffs: Tensor, sums: Tensor) -> Tensor:
    """The training loss Σ_k c_k S_k, in the dtype of the loss sums.

    Casting the (gradient-free) coefficients to the sums' dtype keeps the loss,
    and its backward, in the model's precision.
    """
    return (coeffs.to(dtype=sums.dtype, device=sums.device) * sums).sum()


def effective_weights(coeffs: Tensor, counts: Tensor | Sequence[int]) -> Tensor:
    """Share of the loss owned by each horizon per token: c_k N_k / Σ_j c_j N_j.

    All zeros when the denominator is 0 (e.g. every horizon empty).
    """
    counts_t = torch.as_tensor(counts, dtype=coeffs.dtype, device=coeffs.device)
    mass = coeffs * counts_t
    return _safe_divide(mass, mass.sum().expand_as(mass))

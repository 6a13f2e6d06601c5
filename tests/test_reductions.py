"""Reduction policies against hand-computed oracles (docs/api.md).

Fixture: counts N = (9, 6, 3) (the packed worked example), λ = (1, 1/2, 1/4),
T = 21, loss sums S = (18, 9, 6). Every expected number below was worked out by hand.
"""

from fractions import Fraction as F

import pytest
import torch

from lab.errors import ConfigError
from lab.objective.reductions import (
    POLICIES,
    coefficients,
    effective_weights,
    reduced_loss,
    validate_reduction,
)

COUNTS = (9, 6, 3)
LAMBDAS = (1.0, 0.5, 0.25)
T = 21
SUMS = torch.tensor([18.0, 9.0, 6.0], dtype=torch.float64)

# c_k by hand:
#   sum:              λ                                   = 1, 1/2, 1/4
#   global:           λ / (9+6+3) = λ/18                  = 1/18, 1/36, 1/72
#   weighted_pair:    λ / (9 + 3 + 3/4) = λ / (51/4)      = 4/51, 2/51, 1/51
#   head_mean:        1/9, (1/2)/6, (1/4)/3               = 1/9, 1/12, 1/12
#   fixed:            λ/21                                = 1/21, 1/42, 1/84
#   main_denominator: λ/9                                 = 1/9, 1/18, 1/36
#   deepseek_paper:   1/9, then λ/21                      = 1/9, 1/42, 1/84
EXPECTED_COEFFICIENTS = {
    "sum": (F(1), F(1, 2), F(1, 4)),
    "global": (F(1, 18), F(1, 36), F(1, 72)),
    "weighted_pair": (F(4, 51), F(2, 51), F(1, 51)),
    "head_mean": (F(1, 9), F(1, 12), F(1, 12)),
    "fixed": (F(1, 21), F(1, 42), F(1, 84)),
    "main_denominator": (F(1, 9), F(1, 18), F(1, 36)),
    "deepseek_paper": (F(1, 9), F(1, 42), F(1, 84)),
}

# Σ c_k S_k with S = (18, 9, 6); note Σ λ_k S_k = 18 + 9/2 + 6/4 = 24:
#   sum 24; global 24/18; weighted_pair 24·4/51; head_mean 2 + 3/4 + 1/2;
#   fixed 24/21; main_denominator 24/9; deepseek_paper 2 + (9/2 + 3/2)/21 = 2 + 2/7.
EXPECTED_LOSS = {
    "sum": F(24),
    "global": F(4, 3),
    "weighted_pair": F(32, 17),
    "head_mean": F(13, 4),
    "fixed": F(8, 7),
    "main_denominator": F(8, 3),
    "deepseek_paper": F(16, 7),
}

# c_k N_k / Σ c_j N_j. Every policy with c ∝ λ gives λN / Σ λN = (9, 3, 3/4) / (51/4)
# = (12/17, 4/17, 1/17); head_mean gives (1, 1/2, 1/4) / (7/4) = (4/7, 2/7, 1/7);
# deepseek_paper gives (9/9, 6/42, 3/84) = (1, 1/7, 1/28), sum 33/28 → (28/33, 4/33, 1/33).
PROPORTIONAL = (F(12, 17), F(4, 17), F(1, 17))
EXPECTED_EFFECTIVE = {
    "sum": PROPORTIONAL,
    "global": PROPORTIONAL,
    "weighted_pair": PROPORTIONAL,
    "head_mean": (F(4, 7), F(2, 7), F(1, 7)),
    "fixed": PROPORTIONAL,
    "main_denominator": PROPORTIONAL,
    "deepseek_paper": (F(28, 33), F(4, 33), F(1, 33)),
}


def as_tensor(fractions) -> torch.Tensor:
    return torch.tensor([float(f) for f in fractions], dtype=torch.float64)


def assert_exact(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-15, atol=0.0)


def test_registry_holds_exactly_the_design_policies():
    assert set(POLICIES) == set(EXPECTED_COEFFICIENTS)


@pytest.mark.parametrize("policy", sorted(EXPECTED_COEFFICIENTS))
def test_coefficients_match_hand_oracle(policy):
    coeffs = coefficients(policy, COUNTS, LAMBDAS, fixed_denominator=T)
    assert coeffs.dtype == torch.float64 and coeffs.shape == (3,)
    assert_exact(coeffs, as_tensor(EXPECTED_COEFFICIENTS[policy]))


@pytest.mark.parametrize("policy", sorted(EXPECTED_LOSS))
def test_reduced_loss_matches_hand_oracle(policy):
    coeffs = coefficients(policy, COUNTS, LAMBDAS, fixed_denominator=T)
    loss = reduced_loss(coeffs, SUMS)
    assert loss.shape == ()
    assert_exact(loss, torch.tensor(float(EXPECTED_LOSS[policy]), dtype=torch.float64))


@pytest.mark.parametrize("policy", sorted(EXPECTED_EFFECTIVE))
def test_effective_weights_match_hand_oracle(policy):
    coeffs = coefficients(policy, COUNTS, LAMBDAS, fixed_denominator=T)
    assert_exact(effective_weights(coeffs, COUNTS), as_tensor(EXPECTED_EFFECTIVE[policy]))


def test_tensor_inputs_give_the_same_coefficients_as_sequences():
    from_tensors = coefficients(
        "weighted_pair", torch.tensor(COUNTS), torch.tensor(LAMBDAS, dtype=torch.float64)
    )
    assert_exact(from_tensors, coefficients("weighted_pair", COUNTS, LAMBDAS))


def test_float32_lambdas_give_float32_coefficients():
    coeffs = coefficients("head_mean", torch.tensor(COUNTS), torch.tensor(LAMBDAS, dtype=torch.float32))
    assert coeffs.dtype == torch.float32
    torch.testing.assert_close(coeffs, torch.tensor([1 / 9, 1 / 12, 1 / 12], dtype=torch.float32))


def test_reduced_loss_keeps_the_sums_dtype_and_gradient():
    sums = SUMS.to(torch.float32).requires_grad_()
    coeffs = coefficients("head_mean", COUNTS, LAMBDAS)
    loss = reduced_loss(coeffs, sums)
    loss.backward()
    assert loss.dtype == torch.float32
    # dL/dS_k = c_k: the coefficients themselves carry no gradient.
    torch.testing.assert_close(sums.grad, coeffs.to(torch.float32))
    assert not coeffs.requires_grad


def horizon_term(policy: str, counts, sums, fixed_denominator: int) -> torch.Tensor:
    coeffs = coefficients(policy, counts, (1.0, 1.0, 1.0), fixed_denominator=fixed_denominator)
    return coeffs[1] * sums[1]


def test_fixed_and_head_mean_differ_at_horizon_two_when_count_is_not_t():
    # N_2 = 6 ≠ T = 21: head_mean gives 9/6 = 3/2, fixed gives 9/21 = 3/7.
    assert horizon_term("head_mean", COUNTS, SUMS, T).item() == 1.5
    assert horizon_term("fixed", COUNTS, SUMS, T).item() == pytest.approx(3 / 7, rel=1e-15)
    fixed_total = reduced_loss(coefficients("fixed", COUNTS, (1, 1, 1), fixed_denominator=T), SUMS)
    head_total = reduced_loss(coefficients("head_mean", COUNTS, (1, 1, 1)), SUMS)
    assert fixed_total.item() != head_total.item()


def test_fixed_and_head_mean_agree_at_horizon_two_when_count_equals_t():
    counts = (6, 6, 3)
    assert horizon_term("head_mean", counts, SUMS, 6).item() == horizon_term("fixed", counts, SUMS, 6).item() == 1.5


def test_deepseek_paper_is_main_mean_plus_weighted_fixed_extras():
    # S_1/N_1 + Σ_{k≥2} λ_k S_k / T = 18/9 + (1/2·9 + 1/4·6)/21 = 2 + 6/21 = 16/7.
    loss = reduced_loss(coefficients("deepseek_paper", COUNTS, LAMBDAS, fixed_denominator=T), SUMS)
    assert loss.item() == pytest.approx(16 / 7, rel=1e-15)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_empty_horizon_contributes_exactly_zero(policy):
    counts = (9, 0, 3)
    sums = torch.tensor([18.0, 0.0, 6.0], dtype=torch.float64)
    coeffs = coefficients(policy, counts, LAMBDAS, fixed_denominator=T)
    assert torch.isfinite(coeffs).all()
    assert (coeffs[1] * sums[1]).item() == 0.0
    with_empty = reduced_loss(coeffs, sums)
    assert torch.isfinite(with_empty)
    assert with_empty.item() == (coeffs[0] * sums[0] + coeffs[2] * sums[2]).item()
    assert torch.isfinite(effective_weights(coeffs, counts)).all()


def test_head_mean_zeroes_only_the_empty_coefficient():
    coeffs = coefficients("head_mean", (9, 0, 3), LAMBDAS)
    assert_exact(coeffs, as_tensor((F(1, 9), F(0), F(1, 12))))


def test_main_denominator_with_empty_main_horizon_is_all_zero():
    assert coefficients("main_denominator", (0, 6, 3), LAMBDAS).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_all_empty_counts_give_finite_coefficients_and_zero_loss(policy):
    counts = (0, 0, 0)
    coeffs = coefficients(policy, counts, LAMBDAS, fixed_denominator=T)
    assert torch.isfinite(coeffs).all()
    assert reduced_loss(coeffs, torch.zeros(3, dtype=torch.float64)).item() == 0.0
    assert effective_weights(coeffs, counts).tolist() == [0.0, 0.0, 0.0]


def test_unknown_policy_names_the_field_and_the_choices():
    with pytest.raises(ConfigError, match=r"^reduction\.policy: unknown 'mean'; allowed: sum, global") as error:
        coefficients("mean", COUNTS, LAMBDAS)
    assert error.value.field == "reduction.policy"


@pytest.mark.parametrize("policy", ["fixed", "deepseek_paper"])
@pytest.mark.parametrize("bad", [None, 0, -3, float("inf"), float("nan")])
def test_fixed_denominator_policies_need_a_positive_t(policy, bad):
    with pytest.raises(ConfigError, match=r"^reduction\.fixed_denominator: ") as error:
        coefficients(policy, COUNTS, LAMBDAS, fixed_denominator=bad)
    assert error.value.field == "reduction.fixed_denominator"
    with pytest.raises(ConfigError, match=r"^reduction\.fixed_denominator: "):
        validate_reduction(policy, bad)


def test_policies_without_t_ignore_fixed_denominator():
    validate_reduction("head_mean", None)
    assert_exact(coefficients("head_mean", COUNTS, LAMBDAS, fixed_denominator=None),
                 as_tensor(EXPECTED_COEFFICIENTS["head_mean"]))


def test_fixed_denominator_may_be_a_tensor():
    coeffs = coefficients("fixed", COUNTS, LAMBDAS, fixed_denominator=torch.tensor(T))
    assert_exact(coeffs, as_tensor(EXPECTED_COEFFICIENTS["fixed"]))


def test_length_mismatch_names_the_lambdas_field():
    with pytest.raises(ConfigError, match=r"^weights\.lambdas: has 2 entries but there are 3 horizons") as error:
        coefficients("sum", COUNTS, (1.0, 0.5))
    assert error.value.field == "weights.lambdas"


def test_unknown_policy_is_rejected_at_start_up():
    with pytest.raises(ConfigError, match=r"^reduction\.policy: "):
        validate_reduction("per_token", 21)

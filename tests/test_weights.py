"""Loss-weight schedules: hand-computed λ at chosen steps and token counts."""


import pytest
import torch

from lab.errors import ConfigError
from lab.objective.reductions import coefficients, reduced_loss
from lab.objective.weights import (
    WEIGHT_SCHEDULES,
    Progress,
    build_weight_schedule,
    forward_active_horizons,
)


def at(step: int = 0, tokens: int = 0, total: int = 10) -> Progress:
    return Progress(step=step, consumed_tokens=tokens, total_steps=total)


def lambdas(name: str, k: int, progress: Progress, **options) -> list[float]:
    values = build_weight_schedule(name, k, **options).lambdas(progress)
    assert values.dtype == torch.float64 and values.shape == (k,)
    return values.tolist()


def test_registry_names():
    assert set(WEIGHT_SCHEDULES) == {
        "uniform", "geometric", "medusa", "deepseek", "linear_decay",
        "curriculum_forward", "curriculum_reverse", "anneal", "phased",
    }


@pytest.mark.parametrize("name", sorted(WEIGHT_SCHEDULES))
@pytest.mark.parametrize("step", [0, 5, 10])
def test_k_one_is_always_the_plain_next_token_weight(name, step):
    options = {"phases": [[1], [1]]} if name == "phased" else {}  # phased's default (the record's) needs K ≥ 3
    assert lambdas(name, 1, at(step, tokens=10**14), **options) == [1.0]


# ------------------------------------------------------------------ uniform


def test_uniform_is_all_ones():
    assert lambdas("uniform", 3, at(7)) == [1.0, 1.0, 1.0]


def test_uniform_takes_an_explicit_list():
    assert lambdas("uniform", 3, at(), lambdas=[1, 0.5, 0]) == [1.0, 0.5, 0.0]


@pytest.mark.parametrize("bad", [[1.0, 0.5], [1.0, -0.5, 1.0], [1.0, float("nan"), 1.0], [1.0, "x", 1.0], "abc", 3])
def test_uniform_rejects_bad_explicit_lists(bad):
    with pytest.raises(ConfigError, match=r"^weights\.lambdas: ") as error:
        build_weight_schedule("uniform", 3, lambdas=bad)
    assert error.value.field == "weights.lambdas"


# ------------------------------------------------------------------ geometric, medusa


def test_geometric_decays_by_gamma_per_horizon():
    assert lambdas("geometric", 4, at(), gamma=0.5) == [1.0, 0.5, 0.25, 0.125]


@pytest.mark.parametrize("bad", [0, -0.5, float("inf"), float("nan"), "half"])
def test_geometric_rejects_bad_gamma(bad):
    with pytest.raises(ConfigError, match=r"^weights\.gamma: "):
        build_weight_schedule("geometric", 3, gamma=bad)


def test_medusa_default_is_point_eight_to_the_extra_head_index():
    # Extra head i = k - 1 gets 0.8^i: 1, 0.8, 0.64, 0.512.
    values = lambdas("medusa", 4, at())
    torch.testing.assert_close(torch.tensor(values), torch.tensor([1.0, 0.8, 0.64, 0.512]), rtol=1e-15, atol=0)


def test_medusa_base_is_configurable():
    assert lambdas("medusa", 3, at(), base=0.5) == [1.0, 0.5, 0.25]
    with pytest.raises(ConfigError, match=r"^weights\.base: "):
        build_weight_schedule("medusa", 3, base=0)


# ------------------------------------------------------------------ deepseek


def test_deepseek_splits_lambda_over_the_extra_depths():
    # K = 3 → D = 2 extra depths: 0.3/2 before the switch, 0.1/2 after.
    schedule = build_weight_schedule("deepseek", 3, switch_tokens=1000)
    assert schedule.lambdas(at(tokens=0)).tolist() == [1.0, 0.15, 0.15]
    assert schedule.lambdas(at(tokens=5000)).tolist() == [1.0, 0.05, 0.05]


def test_deepseek_switches_exactly_at_switch_tokens():
    schedule = build_weight_schedule("deepseek", 2, switch_tokens=1000)
    assert schedule.lambdas(at(tokens=999)).tolist() == [1.0, 0.3]
    assert schedule.lambdas(at(tokens=1000)).tolist() == [1.0, 0.1]
    assert schedule.lambdas(at(tokens=1001)).tolist() == [1.0, 0.1]


def test_deepseek_defaults_to_the_paper_proportion_of_training():
    # 10T of 14.8T tokens = 67.6 %: over 1000 steps, steps 0..675 use 0.3 and 676.. use 0.1.
    schedule = build_weight_schedule("deepseek", 2)
    assert schedule.switch_at == 0.676 and schedule.switch_tokens is None
    assert schedule.lambdas(at(675, total=1000)).tolist() == [1.0, 0.3]
    assert schedule.lambdas(at(676, total=1000)).tolist() == [1.0, 0.1]
    # Over 600 steps: 0.676 · 600 = 405.6, so step 405 is before the switch and 406 after it.
    assert schedule.lambdas(at(405, total=600)).tolist() == [1.0, 0.3]
    assert schedule.lambdas(at(406, total=600)).tolist() == [1.0, 0.1]
    # The fraction ignores tokens.
    assert schedule.lambdas(at(0, tokens=10**15, total=1000)).tolist() == [1.0, 0.3]


def test_deepseek_switch_at_a_chosen_fraction():
    assert lambdas("deepseek", 2, at(4, total=10), switch_at=0.5) == [1.0, 0.3]
    assert lambdas("deepseek", 2, at(5, total=10), switch_at=0.5) == [1.0, 0.1]
    assert lambdas("deepseek", 2, at(0, total=10), switch_at=0.0) == [1.0, 0.1]
    assert lambdas("deepseek", 2, at(10, total=10), switch_at=1.0) == [1.0, 0.1]  # only past the end


def test_deepseek_switch_tokens_takes_precedence_over_the_fraction():
    schedule = build_weight_schedule("deepseek", 2, switch_at=0.0, switch_tokens=1000)
    assert schedule.lambdas(at(9, tokens=999, total=10)).tolist() == [1.0, 0.3]
    assert schedule.lambdas(at(0, tokens=1000, total=10)).tolist() == [1.0, 0.1]


def test_deepseek_switch_zero_uses_final_from_the_start():
    assert lambdas("deepseek", 2, at(tokens=0), switch_tokens=0, initial=0.5, final=0.2) == [1.0, 0.2]


@pytest.mark.parametrize(
    ("option", "bad"),
    [("switch_tokens", -1), ("switch_tokens", 2.5), ("switch_at", 1.5), ("switch_at", -0.1), ("switch_at", None), ("switch_at", "x"),
     ("initial", -0.1), ("final", float("nan"))],
)
def test_deepseek_rejects_bad_options(option, bad):
    with pytest.raises(ConfigError, match=rf"^weights\.{option}: "):
        build_weight_schedule("deepseek", 3, **{option: bad})


def test_deepseek_schedule_with_paper_policy_is_the_paper_objective():
    # L = L_main + (λ/D) Σ_d S_d/T with λ = 0.3, D = 2, N = (9, 6, 3), S = (18, 9, 6), T = 21:
    # 18/9 + 0.15 · (9 + 6)/21 = 2 + 2.25/21 = 2 + 3/28 = 59/28.
    lam = build_weight_schedule("deepseek", 3, switch_tokens=10).lambdas(at(tokens=0))
    coeffs = coefficients("deepseek_paper", (9, 6, 3), lam, fixed_denominator=21)
    loss = reduced_loss(coeffs, torch.tensor([18.0, 9.0, 6.0], dtype=torch.float64))
    assert loss.item() == pytest.approx(59 / 28, rel=1e-15)


# ------------------------------------------------------------------ linear decay, anneal


def test_linear_decay_goes_from_start_at_step_0_to_end_at_the_last_step():
    # 11 steps, 0..10: weight = 1 - step/10.
    assert lambdas("linear_decay", 3, at(0, total=11)) == [1.0, 1.0, 1.0]
    assert lambdas("linear_decay", 3, at(4, total=11)) == pytest.approx([1.0, 0.6, 0.6], rel=1e-15)
    assert lambdas("linear_decay", 3, at(10, total=11)) == [1.0, 0.0, 0.0]  # the last step
    assert lambdas("linear_decay", 3, at(12, total=11)) == [1.0, 0.0, 0.0]  # past the end: held at `end`


def test_linear_decay_custom_endpoints():
    # 5 steps, 0..4: 0.5 + (0.1 - 0.5) · 2/4 = 0.3 at step 2, 0.1 at step 4.
    assert lambdas("linear_decay", 2, at(2, total=5), start=0.5, end=0.1) == pytest.approx([1.0, 0.3], rel=1e-15)
    assert lambdas("linear_decay", 2, at(4, total=5), start=0.5, end=0.1) == [1.0, 0.1]


def test_single_step_runs_use_the_start_value():
    assert lambdas("linear_decay", 2, at(0, total=1), start=0.5, end=0.1) == [1.0, 0.5]
    assert lambdas("anneal", 2, at(0, total=1), start=0.4) == [1.0, 0.4]


def test_anneal_is_a_cosine_to_zero_at_the_last_step():
    # 4 steps, 0..3: f = step/3.
    assert lambdas("anneal", 2, at(0, total=4)) == [1.0, 1.0]
    # (1 + cos(π/3)) / 2 = 3/4
    assert lambdas("anneal", 2, at(1, total=4)) == pytest.approx([1.0, 0.75], rel=1e-15)
    # 11 steps: f = 5/10, (1 + cos(π/2)) / 2 = 1/2
    assert lambdas("anneal", 3, at(5, total=11)) == pytest.approx([1.0, 0.5, 0.5], rel=1e-15)
    assert lambdas("anneal", 2, at(3, total=4)) == [1.0, 0.0]  # the last step, exactly 0
    assert lambdas("anneal", 2, at(7, total=4)) == [1.0, 0.0]


def test_anneal_start_is_configurable():
    assert lambdas("anneal", 2, at(1, total=4), start=0.4) == pytest.approx([1.0, 0.3], rel=1e-15)


# ------------------------------------------------------------------ curricula


def test_forward_curriculum_phases_for_k4_over_8_steps():
    # n_active = min(4, 1 + floor(4·step/8)): steps 0-1 → 1, 2-3 → 2, 4-5 → 3, 6-8 → 4.
    expected = {0: 1, 1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 4, 8: 4, 9: 4}
    assert {s: forward_active_horizons(4, at(s, total=8)) for s in expected} == expected


def test_forward_curriculum_endpoints():
    assert lambdas("curriculum_forward", 3, at(0, total=9)) == [1.0, 0.0, 0.0]
    assert lambdas("curriculum_forward", 3, at(3, total=9)) == [1.0, 1.0, 0.0]
    assert lambdas("curriculum_forward", 3, at(9, total=9)) == [1.0, 1.0, 1.0]


def test_reverse_curriculum_endpoints():
    assert lambdas("curriculum_reverse", 3, at(0, total=9)) == [1.0, 1.0, 1.0]
    assert lambdas("curriculum_reverse", 3, at(3, total=9)) == [1.0, 1.0, 0.0]
    assert lambdas("curriculum_reverse", 3, at(6, total=9)) == [1.0, 0.0, 0.0]
    assert lambdas("curriculum_reverse", 3, at(9, total=9)) == [1.0, 0.0, 0.0]


def test_reverse_mirrors_forward_at_every_step():
    forward = build_weight_schedule("curriculum_forward", 5)
    reverse = build_weight_schedule("curriculum_reverse", 5)
    for step in range(0, 14):
        progress = at(step, total=13)
        assert forward.active_horizons(progress) + reverse.active_horizons(progress) == 6


def test_curriculum_with_fewer_steps_than_horizons_still_reaches_k():
    # total_steps = 1 < K = 4: step 0 → 1 active, step 1 → 4 active.
    assert lambdas("curriculum_forward", 4, at(0, total=1)) == [1.0, 0.0, 0.0, 0.0]
    assert lambdas("curriculum_forward", 4, at(1, total=1)) == [1.0, 1.0, 1.0, 1.0]


# ------------------------------------------------------------------ construction errors


def test_unknown_schedule_names_the_field_and_choices():
    with pytest.raises(ConfigError, match=r"^weights\.name: unknown 'cosine'; allowed: uniform, geometric"):
        build_weight_schedule("cosine", 3)


def test_unknown_option_names_the_option():
    with pytest.raises(ConfigError, match=r"^weights\.gamma: not an option of schedule 'medusa'; allowed: base"):
        build_weight_schedule("medusa", 3, gamma=0.5)


@pytest.mark.parametrize("bad_k", [0, -1])
def test_k_must_be_at_least_one(bad_k):
    with pytest.raises(ConfigError, match=r"^head\.k: "):
        build_weight_schedule("uniform", bad_k)


def test_total_steps_must_be_at_least_one():
    with pytest.raises(ConfigError, match=r"^trainer\.max_steps: must be ≥ 1"):
        Progress(step=0, consumed_tokens=0, total_steps=0)


@pytest.mark.parametrize(("field", "kwargs"), [("step", {"step": -1}), ("consumed_tokens", {"consumed_tokens": -1})])
def test_progress_counters_are_non_negative(field, kwargs):
    with pytest.raises(ConfigError, match=rf"^progress\.{field}: "):
        Progress(**{"step": 0, "consumed_tokens": 0, "total_steps": 10, **kwargs})


def test_hydra_style_options_are_accepted():
    # Hydra passes ListConfig / ints; both must work like plain Python values.
    from omegaconf import OmegaConf

    options = OmegaConf.create({"lambdas": [1, 0.5, 0.25]})
    assert lambdas("uniform", 3, at(), lambdas=options.lambdas) == [1.0, 0.5, 0.25]
    assert lambdas("geometric", 3, at(), gamma=1) == [1.0, 1.0, 1.0]


# ------------------------------------------------------------------ resume


RESUME_CASES = [
    ("uniform", {"lambdas": [1.0, 0.7, 0.2]}),
    ("geometric", {"gamma": 0.7}),
    ("medusa", {}),
    ("deepseek", {"switch_tokens": 4000}),
    ("linear_decay", {"start": 0.9, "end": 0.2}),
    ("curriculum_forward", {}),
    ("curriculum_reverse", {}),
    ("anneal", {}),
]


@pytest.mark.parametrize(("name", "options"), RESUME_CASES)
def test_fresh_schedule_at_restored_progress_matches_the_original(name, options):
    original = build_weight_schedule(name, 3, **options)
    trajectory = [Progress(step=s, consumed_tokens=s * 512, total_steps=12) for s in range(13)]
    before = [original.lambdas(p) for p in trajectory]

    restored_at = trajectory[7]
    resumed = build_weight_schedule(name, 3, **options)
    for progress, expected in zip(trajectory[7:], before[7:]):
        assert torch.equal(resumed.lambdas(progress), expected)
    # Evaluating out of order (as after a resume) changes nothing either: no hidden state.
    assert torch.equal(original.lambdas(restored_at), before[7])
    assert torch.equal(original.lambdas(trajectory[0]), before[0])
    assert original == resumed


# ------------------------------------------------------------------ phased (the speed-run record's schedule)

RECORD_PHASES = [[1, 0.5, [0.25, 0]], [1, [0.5, 0]], [1]]


@pytest.mark.parametrize("step, expected, live", [
    # 12 steps in thirds: phase 1 = steps 0-3, phase 2 = 4-7, phase 3 = 8-11; a ramp runs over its phase's fraction
    (0, [1.0, 0.5, 0.25], 3),  # start of phase 1
    (2, [1.0, 0.5, 0.125], 3),  # f = 1/6: halfway through phase 1
    (3, [1.0, 0.5, 0.0625], 3),  # last step of phase 1: 0.25 · (1 - 3/4)
    (4, [1.0, 0.5, 0.0], 2),  # boundary at exactly 1/3: phase 2 starts, horizon 3 is 0 for good
    (6, [1.0, 0.25, 0.0], 2),  # halfway through phase 2
    (7, [1.0, 0.125, 0.0], 2),
    (8, [1.0, 0.0, 0.0], 1),  # boundary at 2/3: only the next-token horizon is left
    (11, [1.0, 0.0, 0.0], 1),
    (12, [1.0, 0.0, 0.0], 1),  # past the end: the last phase holds
])
def test_phased_record_schedule_at_phase_boundaries(step, expected, live):
    schedule = build_weight_schedule("phased", 3, phases=RECORD_PHASES)
    progress = at(step, total=12)
    assert schedule.lambdas(progress).tolist() == expected
    assert schedule.live_horizons(progress) == live


def test_phased_default_is_the_record_schedule():
    """weights.phases left out (Python or `weights=phased`) is RECORD_PHASES: halfway through phase 1 and 2 of 12 steps."""
    assert lambdas("phased", 3, at(2, total=12)) == [1.0, 0.5, 0.125]
    assert lambdas("phased", 3, at(6, total=12)) == [1.0, 0.25, 0.0]


def test_phased_explicit_boundaries_and_horizons_left_out_are_zero():
    schedule = build_weight_schedule("phased", 4, phases=[[1, [1, 0]], [1, 0, 2]], boundaries=[0.25])
    assert lambdas("phased", 4, at(0, total=8), phases=[[1, [1, 0]], [1, 0, 2]], boundaries=[0.25]) == [1.0, 1.0, 0.0, 0.0]
    assert schedule.lambdas(at(1, total=8)).tolist() == [1.0, 0.5, 0.0, 0.0]
    assert schedule.lambdas(at(2, total=8)).tolist() == [1.0, 0.0, 2.0, 0.0]
    # horizon 2 is 0 in the last phase but horizon 3 is not: horizons 1..3 still run, 4 never does
    assert [schedule.live_horizons(at(s, total=8)) for s in (0, 2, 7)] == [3, 3, 3]


def test_phased_a_horizon_that_returns_later_is_not_skipped():
    schedule = build_weight_schedule("phased", 2, phases=[[1, 1], [1, 0], [1, 1]])
    assert [schedule.live_horizons(at(s, total=3)) for s in range(3)] == [2, 2, 2]


@pytest.mark.parametrize("options, field", [
    (dict(phases=[[1, 0.5, 0.25, 0.1]]), "weights.phases[0]"),  # more horizons than K = 3
    (dict(phases=[[1, [0.5, 0, 1]]]), "weights.phases[0]"),
    (dict(phases=[[1, -0.5]]), "weights.phases[0]"),
    (dict(phases="abc"), "weights.phases"),
    (dict(phases=[[1], [1]], boundaries=[0.5, 0.7]), "weights.boundaries"),
    (dict(phases=[[1], [1], [1]], boundaries=[0.6, 0.3]), "weights.boundaries"),
    (dict(phases=[[1], [1]], boundaries=[1.0]), "weights.boundaries"),
])
def test_phased_rejects_bad_phases_naming_the_field(options, field):
    with pytest.raises(ConfigError) as error:
        build_weight_schedule("phased", 3, **options)
    assert error.value.field == field

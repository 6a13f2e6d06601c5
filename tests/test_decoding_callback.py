"""The end-of-training decoding evaluation (lab/callbacks/decoding.py)."""

from __future__ import annotations

import pytest
import torch

from lab.callbacks.decoding import DecodingEval
from lab.decode.evaluation import distinct_ngram_ratio, document_prompts
from lab.decode import generate
from tests.helpers import build_model, make_batch

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread


def test_prompts_are_document_starts_at_most_half_a_document():
    batch = make_batch([[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 0, 0]], [[0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1, -1, -1]])
    assert document_prompts([batch], 10, 2) == [[1, 2], [7], [9], [12]]
    assert document_prompts([batch], 2, 32) == [[1, 2, 3], [7]]


def test_distinct_4gram_ratio():
    assert distinct_ngram_ratio([1, 1, 1, 1, 1, 1]) == pytest.approx(1 / 3)
    assert distinct_ngram_ratio([1, 2, 3, 4, 5]) == 1.0


@pytest.mark.parametrize("name,k,extra", [("deepseek", 2, {"depth": 1}), ("parallel", 3, {}), ("ntp", 1, {})])
def test_greedy_part_reports_the_runs_ledger(name, k, extra):
    model = build_model(name, k, layers=3, **extra).double().eval()
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    report = DecodingEval(new_tokens=16).evaluate(model, prompts)
    metrics = report["metrics"]
    plain = [generate(model, torch.tensor(p), 16).tokens for p in prompts]
    assert [e["plain_tokens"] for e in report["greedy"]["prompts"]] == plain
    if name == "ntp":
        assert metrics["decode/greedy/mean_accept_len"] == 1.0 and "decode/greedy/speedup" not in metrics and "decode/speedup" not in metrics
        return
    spec = [generate(model, torch.tensor(p), 16, speculative=True).stats for p in prompts]
    forwards = sum(s["target_forwards"] for s in spec)
    assert report["greedy"]["speculative"]["tokens_per_forward"] == pytest.approx(3 * 16 / forwards)
    assert metrics["decode/greedy/greedy_match"] == 1.0  # float64: exact
    clean = [s for s, e in zip(spec, report["greedy"]["prompts"]) if not e["degenerate"]]
    if clean:
        assert metrics["decode/greedy/tokens_per_forward"] == pytest.approx(sum(s["emitted"] for s in clean) / sum(s["target_forwards"] for s in clean))
        for j in range(1, k):
            accepted, proposed = (sum(s[key][j - 1] for s in clean) for key in ("accepted_by_position", "proposed_by_position"))
            assert metrics[f"decode/greedy/accept/p{j}"] == pytest.approx(accepted / proposed)


def test_the_headline_is_sampling_over_non_degenerate_prompts_only():
    """A prompt whose continuation repeats is flagged and left out of the T=1 headline, not of the distinct-4 mean."""
    model = build_model("parallel", 3, layers=3).double().eval()
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    seed, new = 7, 24
    report = DecodingEval(new_tokens=new, temperature=1.0, seed=seed).evaluate(model, prompts)
    assert report["settings"]["temperature"] == 1.0 and report["greedy"]["settings"]["temperature"] == 0.0
    spec = [generate(model, torch.tensor(p), new, temperature=1.0, speculative=True, generator=torch.Generator().manual_seed(seed + i))
            for i, p in enumerate(prompts)]
    assert [e["speculative_tokens"] for e in report["prompts"]] == [g.tokens for g in spec]  # the same draws
    flags = [distinct_ngram_ratio(g.tokens) < 0.2 for g in spec]
    assert [e["degenerate"] for e in report["prompts"]] == flags
    metrics = report["metrics"]
    assert metrics["decode/degenerate"] == pytest.approx(sum(flags) / 3) and metrics["decode/prompts_clean"] == 3 - sum(flags)
    assert metrics["decode/distinct4"] == pytest.approx(sum(distinct_ngram_ratio(g.tokens) for g in spec) / 3)
    clean = [g.stats for g, bad in zip(spec, flags) if not bad]
    assert metrics["decode/tokens_per_forward"] == pytest.approx(sum(s["emitted"] for s in clean) / sum(s["target_forwards"] for s in clean))


def test_a_degenerate_prompt_is_excluded_from_the_headline():
    """Force degeneracy: a model whose every logit row is the same constant continues with one token forever."""
    model = build_model("parallel", 3, layers=2).double().eval()
    with torch.no_grad():
        model.trunk.embed.weight.zero_()  # every position holds the same (zero) residual stream
    report = DecodingEval(new_tokens=24, temperature=0.0, greedy=False).evaluate(model, [[1, 2, 3], [4, 5, 6]])
    assert all(e["degenerate"] for e in report["prompts"])
    metrics = report["metrics"]
    assert metrics["decode/degenerate"] == 1.0 and metrics["decode/prompts_clean"] == 0
    assert "decode/tokens_per_forward" not in metrics and "decode/accept/p1" not in metrics and "greedy" not in report


@pytest.mark.parametrize("budget,expected", [(None, (4, 64, 3)), (18.0, (4, 64, 3)), (6.0, (4, 64, 1)), (3.0, (2, 64, 1)),
                                             (1.01, (2, 16, 1)), (0.3, (1, 16, 1))])
def test_a_budget_shrinks_repeats_then_prompts_then_tokens(budget, expected):
    """By hand: a request costs 0.1 s + 0.01 s per token after the first, two passes: 4 x 64 x 3 costs 4·3·2·0.73 = 17.52 s."""
    from lab.callbacks.decoding_budget import DecodePlan, fit_budget

    plan = fit_budget(DecodePlan(4, 64, 3, 2, 0.1, 0.01, budget, (4, 64, 3)))
    assert (plan.prompts, plan.new_tokens, plan.repeats) == expected and plan.shrunk == (expected != (4, 64, 3))
    assert budget is None or plan.expected_s <= budget or expected == (1, 16, 1)  # the floors: the smallest evaluation


def test_a_tiny_models_evaluation_shrinks_to_its_budget(capsys):
    """The probe prices this model's requests; a budget of a tenth of the full evaluation's expected time shrinks it."""
    model = build_model("parallel", 3, layers=3).double().eval()
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [3, 1, 4, 1]]
    callback = DecodingEval(prompts=4, new_tokens=64, repeats=3)
    full = callback.plan(model, prompts, None)
    assert not full.shrunk and full.expected_s > 0
    plan = callback.plan(model, prompts, full.expected_s / 10)
    assert plan.shrunk and plan.repeats == 1 and plan.expected_s <= plan.budget_s
    assert "shrunk to fit" in capsys.readouterr().out  # the plan and its expected time, printed before decoding
    report = callback.evaluate(model, prompts[: plan.prompts], plan)
    assert report["settings"]["prompts"] == plan.prompts and report["settings"]["new_tokens"] == plan.new_tokens
    assert report["budget"]["requested"] == (4, 64, 3) and report["budget"]["took_s"] > 0
    assert report["metrics"]["decode/pairs"] <= plan.prompts * plan.repeats


def test_bad_budget_and_repeats_name_the_field():
    from lab.errors import ConfigError

    for kwargs, field in (({"budget_s": "soon"}, "callbacks.decoding.budget_s"), ({"budget_s": -1}, "callbacks.decoding.budget_s"),
                          ({"repeats": 0}, "callbacks.decoding.repeats")):
        with pytest.raises(ConfigError) as error:
            DecodingEval(**kwargs)
        assert error.value.field == field

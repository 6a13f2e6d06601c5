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
def test_evaluate_reports_the_runs_ledger(name, k, extra):
    model = build_model(name, k, layers=3, **extra).double().eval()
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    report = DecodingEval(new_tokens=16).evaluate(model, prompts)
    metrics = report["metrics"]
    plain = [generate(model, torch.tensor(p), 16).tokens for p in prompts]
    assert [e["plain_tokens"] for e in report["prompts"]] == plain
    if name == "ntp":
        assert metrics["decode/tokens_per_forward"] == 1.0 and "decode/speedup" not in metrics
        return
    spec = [generate(model, torch.tensor(p), 16, speculative=True).stats for p in prompts]
    forwards = sum(s["target_forwards"] for s in spec)
    assert metrics["decode/tokens_per_forward"] == pytest.approx(3 * 16 / forwards)
    assert metrics["decode/greedy_match"] == 1.0  # float64: exact
    proposed = [sum(s["proposed_by_position"][j] for s in spec) for j in range(k - 1)]
    accepted = [sum(s["accepted_by_position"][j] for s in spec) for j in range(k - 1)]
    for j in range(1, k):
        assert metrics[f"decode/accept/p{j}"] == pytest.approx(accepted[j - 1] / proposed[j - 1])
    assert metrics["decode/speedup"] > 0 and metrics["decode/predicted_speedup"] > 0

"""Answer metrics that name the Clever-Hans signature (lab/decode/answers.py, lab/report/answers.py).

Hand-built bigram models (tests/helpers.py: greedy next token = next_of[current token], any
other token → 0) on star-graph-shaped examples: two centres (1 and 6), each with two arms, so a
model that reads only the previous token can follow edges but cannot choose the arm that ends
at the goal. Every value below is counted by hand from the examples and the bigram tables.
"""

from __future__ import annotations

import math

import pytest
import torch

from lab.decode.answers import answer_accuracy
from lab.decode.generate import generate
from lab.model.mtp import build_model
from lab.report.answers import above_chance, clever_hans
from tests.helpers import bigram_model

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB, DUMMY = 14, 13
# (prompt, answer): the prompt's last token stands for the query, the answer is centre, arm node, leaf.
A, B = ([10], [1, 2, 3]), ([10], [1, 4, 5])  # centre 1: arms 1→2→3 and 1→4→5
C, D = ([11], [6, 7, 8]), ([11], [6, 9, 12])  # centre 6: arms 6→7→8 and 6→9→12
STAR = [A, B, C, D]
DECISION = 1  # the first arm node after the centre


def test_a_perfect_model_scores_one_everywhere_with_zero_standard_error():
    perfect = bigram_model(VOCAB, {10: 1, 1: 2, 2: 3, 11: 6, 6: 7, 7: 8})
    scores = answer_accuracy(perfect, [A, C], DECISION)
    assert scores == {"answer_exact": 1.0, "answer_exact_se": 0.0, "answer_token_acc": 1.0, "answer_tf_acc": 1.0,
                      "answer_first_acc": 1.0, "answer_first_acc_se": 0.0, "answer_exact_given_first": 1.0,
                      "answer_exact_given_first_se": 0.0, "answer_examples": 2.0}


def test_a_clever_hans_model_flips_a_coin_at_the_decision_and_then_follows_edges():
    # Always the first arm: right for A and C, and after the decision every edge is followed.
    hans = bigram_model(VOCAB, {10: 1, 1: 2, 2: 3, 4: 5, 11: 6, 6: 7, 7: 8, 9: 12})
    scores = answer_accuracy(hans, STAR, DECISION)
    assert scores == {
        "answer_exact": 0.5, "answer_exact_se": 0.25,  # sqrt(0.5 · 0.5 / 4)
        "answer_token_acc": 8 / 12,  # A, C whole; B, D only the centre
        "answer_tf_acc": 10 / 12,  # given the true arm node, B's 4 → 5 and D's 9 → 12 are right too
        "answer_first_acc": 0.5, "answer_first_acc_se": 0.25,
        "answer_exact_given_first": 1.0, "answer_exact_given_first_se": 0.0, "answer_examples": 4.0,
    }
    final = {f"val/{name}": value for name, value in scores.items()} | {"val/answer_first_chance": 0.5}
    assert clever_hans(final) is True and above_chance(final) is False


def test_a_model_wrong_at_every_decision_has_no_exact_given_first():
    wrong = bigram_model(VOCAB, {10: 1, 1: 9, 9: 12, 11: 6, 6: 2, 2: 3})
    scores = answer_accuracy(wrong, STAR, DECISION)
    assert math.isnan(scores.pop("answer_exact_given_first")) and math.isnan(scores.pop("answer_exact_given_first_se"))
    assert scores == {"answer_exact": 0.0, "answer_exact_se": 0.0, "answer_token_acc": 4 / 12,  # the centres only
                      "answer_tf_acc": 6 / 12,  # centres, A's 2 → 3, D's 9 → 12
                      "answer_first_acc": 0.0, "answer_first_acc_se": 0.0, "answer_examples": 4.0}
    final = {f"val/{name}": value for name, value in answer_accuracy(wrong, STAR, DECISION).items()} | {"val/answer_first_chance": 0.5}
    assert clever_hans(final) is False and above_chance(final) is False


def test_a_random_model_is_scored_against_answers_built_from_its_own_greedy_output():
    """Answers are the model's greedy output (exact), with the leaf changed (decision right, not exact) or
    the decision changed (neither), by example index mod 3: 14 + 13 + 13 of 40."""
    torch.manual_seed(0)
    model = build_model({"vocab_size": VOCAB, "d_model": 16, "n_heads": 2, "n_layers": 3}, {"name": "parallel", "k": 2})
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, VOCAB, (5,), generator=gen).tolist() for _ in range(40)]
    examples = []
    for i, prompt in enumerate(prompts):
        answer = generate(model, torch.tensor(prompt), 3).tokens
        changed = {0: None, 1: 2, 2: DECISION}[i % 3]
        if changed is not None:
            answer[changed] = (answer[changed] + 1) % VOCAB
        examples.append((prompt, answer))
    scores = answer_accuracy(model, examples, DECISION)
    assert scores["answer_exact"] == 14 / 40 and scores["answer_first_acc"] == 27 / 40
    assert scores["answer_exact_given_first"] == pytest.approx(14 / 27)
    assert scores["answer_token_acc"] == pytest.approx((3 * 14 + 2 * 13 + 2 * 13) / 120)  # one token changed, the leaf after a wrong decision kept
    assert scores["answer_exact_se"] == pytest.approx(math.sqrt(0.35 * 0.65 / 40))
    assert scores["answer_exact_given_first_se"] == pytest.approx(math.sqrt(14 / 27 * 13 / 27 / 27))


def test_teacherless_decoding_reads_dummies_instead_of_its_own_answer():
    # The Clever-Hans table plus dummy → 4: the inputs are [query, dummy, dummy], so every example gets [centre, 4, 4].
    hans = bigram_model(VOCAB, {10: 1, 1: 2, 2: 3, 4: 5, 11: 6, 6: 7, 7: 8, 9: 12, DUMMY: 4})
    scores = answer_accuracy(hans, STAR, DECISION, dummy_id=DUMMY)
    assert scores["answer_exact"] == 0.0 and scores["answer_first_acc"] == 0.25  # only B's decision is 4
    assert scores["answer_exact_given_first"] == 0.0  # B's leaf is 5, not 4
    assert scores["answer_token_acc"] == scores["answer_tf_acc"] == 5 / 12  # four centres and B's 4; no teacher to force


@pytest.mark.parametrize("first,given,expected_hans,expected_above", [
    (0.45, 0.99, True, False),  # |0.45 − 0.5| = 0.05 ≤ 2·sqrt(0.25/256) = 0.0625; 0.01 ≤ 2·sqrt(0.99·0.01/115) = 0.0186
    (0.58, 1.0, False, True),  # 0.08 > 0.0625: above chance
    (0.5, 0.9, False, False),  # 0.1 > 2·sqrt(0.9·0.1/128) = 0.053: the edges are not followed
    (0.5, 1.0, True, False),
    (0.4, 1.0, False, False),  # 0.1 below chance: neither
])
def test_the_signature_is_chance_within_two_standard_errors_and_exact_given_first_near_one(first, given, expected_hans, expected_above):
    final = {"val/answer_first_acc": first, "val/answer_exact_given_first": given, "val/answer_first_chance": 0.5,
             "val/answer_examples": 256.0}
    assert clever_hans(final) is expected_hans and above_chance(final) is expected_above
    assert clever_hans({"val/answer_first_acc": first}) is None  # a run without the metrics is not judged

"""Answer accuracy of a synthetic task: greedy answers scored against the truth, with their standard errors.

Per example (prompt ids, answer ids) the model writes len(answer) tokens greedily and is scored:

    answer_exact               the whole answer right
    answer_token_acc           per answer position
    answer_tf_acc              teacher-forced: the horizon-1 argmax given the true answer prefix
    answer_first_acc           the answer right up to and including its decision token (the task's
                               `decision_index`: star graphs the first arm node, induction the first copy)
    answer_exact_given_first   exact among the answers whose decision is right
    answer_examples            how many examples were scored (n)
    *_se                       binomial standard error sqrt(p (1 − p) / n) of exact, first and given-first
                               (given-first over its own n: the answers whose decision is right)

The Clever-Hans signature of Bachmann & Nagarajan: the decision at chance (1/degree) and every
later token right once it is made (exact-given-first ≈ 1) — a model that follows edges but
never plans. lab.report.render.clever_hans says when the logged numbers show it.

Teacherless models (`objective.teacherless=true`, lab/data/synthetic/teacherless.py) never see an
answer token as input, so for them greedy decoding is one forward over the prompt followed by
len(answer) − 1 dummy tokens, every answer token the argmax at its row; there is no teacher to
force, so answer_tf_acc is that same forward (= answer_token_acc).
"""

from __future__ import annotations

import math

import torch

from lab.decode.generate import generate


def answer_accuracy(model, examples: list[tuple[list[int], list[int]]], decision_index: int = 0,
                    dummy_id: int | None = None) -> dict[str, float]:
    """The metrics above over `examples`; `dummy_id` set: the model is teacherless (see the module doc)."""
    was_training = model.training
    if dummy_id is None:
        greedy = [generate(model, torch.tensor(prompt), len(answer)).tokens for prompt, answer in examples]
        forced = teacher_forced_answers(model, examples)
    else:
        greedy = forced = teacher_forced_answers(model, [(prompt, [dummy_id] * len(answer)) for prompt, answer in examples])
    model.train(was_training)
    return score_answers(greedy, forced, [answer for _, answer in examples], decision_index)


def score_answers(greedy: list[list[int]], forced: list[list[int]], answers: list[list[int]], decision_index: int) -> dict[str, float]:
    n = len(answers)
    n_tokens = sum(len(a) for a in answers)
    hits = lambda predicted, answer: sum(p == a for p, a in zip(predicted, answer))  # noqa: E731
    exact = [g == a for g, a in zip(greedy, answers)]
    first = [g[: decision_index + 1] == a[: decision_index + 1] for g, a in zip(greedy, answers)]
    n_first = sum(first)
    exact_rate, first_rate = sum(exact) / n, n_first / n
    given_first = sum(exact) / n_first if n_first else math.nan  # an exact answer has its decision right
    return {
        "answer_exact": exact_rate,
        "answer_exact_se": binomial_se(exact_rate, n),
        "answer_token_acc": sum(hits(g, a) for g, a in zip(greedy, answers)) / n_tokens,
        "answer_tf_acc": sum(hits(f, a) for f, a in zip(forced, answers)) / n_tokens,
        "answer_first_acc": first_rate,
        "answer_first_acc_se": binomial_se(first_rate, n),
        "answer_exact_given_first": given_first,
        "answer_exact_given_first_se": binomial_se(given_first, n_first) if n_first else math.nan,
        "answer_examples": float(n),
    }


def binomial_se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


def teacher_forced_answers(model, examples: list[tuple[list[int], list[int]]]) -> list[list[int]]:
    """The horizon-1 argmax at each answer position given the prompt and the (given) answer tokens before it."""
    device = next(model.parameters()).device
    length = max(len(p) + len(a) for p, a in examples)
    tokens = torch.zeros(len(examples), length, dtype=torch.long)  # [N, L]
    active = torch.zeros(len(examples), length, dtype=torch.bool)  # [N, L]
    for i, (prompt, answer) in enumerate(examples):
        tokens[i, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)  # [P+A] into row i, padding after
        active[i, : len(prompt) + len(answer)] = True  # [P+A]
    batch = {
        "tokens": tokens.to(device),
        "active": active.to(device),
        "segment_ids": torch.where(active, 0, -1).to(device),  # [N, L]: one document per row, -1 padding
        "position_ids": torch.arange(length).expand(len(examples), length).to(device),  # [N, L]
    }
    model.eval()
    predicted = model.next_token_logits(batch).argmax(-1).cpu()  # [N, L]: row t predicts token t+1
    # Answer token j sits at P + j and is predicted by row P + j - 1.
    return [predicted[i, len(p) - 1 : len(p) + len(a) - 1].tolist() for i, (p, a) in enumerate(examples)]  # [A] per example

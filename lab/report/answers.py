"""What a synthetic run's answer metrics show (lab/decode/answers.py logs them): the Clever-Hans signature or a plan.

For one run, with n = val/answer_examples validation answers, decision accuracy f
(val/answer_first_acc), its chance level c (val/answer_first_chance: 1/degree on star graphs)
and g = val/answer_exact_given_first over the n·f answers whose decision is right:

- **Clever-Hans signature**: |f − c| ≤ 2·sqrt(c (1 − c) / n) (the decision is a coin flip: within
  two standard errors of chance, the standard error taken at chance so it is defined at f = 0 or 1)
  and 1 − g ≤ 2·sqrt(g (1 − g) / (n·f)) (once the decision is right, the rest is right: within two
  standard errors of 1; g = 1 qualifies).
- **above chance**: f − c > 2·sqrt(c (1 − c) / n) — the decision is made better than a coin flip,
  i.e. the model escaped the shortcut at least partly.
"""

from __future__ import annotations

import math

from lab.report.records import finite

def chance_se(final: dict) -> float | None:
    """sqrt(c (1 − c) / n): the standard error of a coin-flip decision over the run's n answers."""
    c, n = final.get("val/answer_first_chance"), final.get("val/answer_examples")
    if not (finite(c) and finite(n) and n > 0):
        return None
    return math.sqrt(c * (1 - c) / n)


def above_chance(final: dict) -> bool | None:
    se, f = chance_se(final), final.get("val/answer_first_acc")
    if se is None or not finite(f):
        return None
    return f - final["val/answer_first_chance"] > 2 * se


def clever_hans(final: dict) -> bool | None:
    """The signature (module doc) in one run's final metrics; None when they are not all logged."""
    se, f, g = chance_se(final), final.get("val/answer_first_acc"), final.get("val/answer_exact_given_first")
    if se is None or not finite(f):
        return None
    at_chance = abs(f - final["val/answer_first_chance"]) <= 2 * se
    if not finite(g):  # no decision right: nothing to follow, not the signature
        return False
    n_first = round(f * final["val/answer_examples"])
    return at_chance and 1 - g <= 2 * math.sqrt(g * (1 - g) / n_first)


def count_runs(records: list[dict], test) -> tuple[int, int]:
    """(runs where `test` holds, runs where it can be decided)."""
    verdicts = [test(r["final"]) for r in records]
    decided = [v for v in verdicts if v is not None]
    return sum(decided), len(decided)

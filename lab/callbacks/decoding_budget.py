"""How much end-of-run decoding a run can afford: prompts × new tokens × repeats sized to a time budget.

A decoding request costs what the model costs: microseconds a token for a toy, a large share of a
second for a 135 M-parameter trunk on a CPU. So before the evaluation, a probe times one request of
one token (prefill) and one of `1 + PROBE_TOKENS` tokens on each side (plain, speculative), giving

    request_s(n) = prefill_s + (n − 1) × per_token_s

and the evaluation's expected time = prompts × repeats × passes × Σ_sides request_s(new_tokens).
When that exceeds the budget, the evaluation shrinks in this order until it fits (never below the
floors): repeats (to 1), prompts (to `MIN_PROMPTS`), new tokens (to `MIN_NEW_TOKENS`), prompts (to 1).
The default budget is the training time the run just measured: the evaluation never takes longer
than the training it follows.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from lab.decode import generate
from lab.tracking.timing import timed

PROBE_TOKENS = 8
MIN_PROMPTS = 2
MIN_NEW_TOKENS = 16


@dataclass
class DecodePlan:
    prompts: int
    new_tokens: int
    repeats: int
    passes: int  # 2 with the greedy part, else 1
    prefill_s: float  # per request, plain and speculative summed
    per_token_s: float  # per new token, plain and speculative summed
    budget_s: float | None
    requested: tuple[int, int, int]  # (prompts, new_tokens, repeats) asked for

    @property
    def expected_s(self) -> float:
        return self.cost(self.prompts, self.new_tokens, self.repeats)

    @property
    def shrunk(self) -> bool:
        return (self.prompts, self.new_tokens, self.repeats) != tuple(self.requested)

    def cost(self, prompts: int, new_tokens: int, repeats: int) -> float:
        return prompts * repeats * self.passes * (self.prefill_s + (new_tokens - 1) * self.per_token_s)

    def record(self) -> dict:
        return {**asdict(self), "expected_s": self.expected_s, "shrunk": self.shrunk}

    def describe(self) -> str:
        fit = "no budget" if self.budget_s is None else f"budget {self.budget_s:.1f} s"
        asked = f"; asked for {' × '.join(map(str, self.requested))}, shrunk to fit" if self.shrunk else ""
        return (f"decoding evaluation: {self.prompts} prompts × {self.new_tokens} new tokens × {self.repeats} repeats "
                f"× {self.passes} pass(es), plain and speculative interleaved: expect ~{self.expected_s:.1f} s ({fit}{asked})")


def probe_costs(model, prompt: list[int], speculative: bool) -> tuple[float, float]:
    """(prefill_s, per_token_s), each summed over the sides decoded (plain, and speculative when the heads draft)."""
    prefill_s = per_token_s = 0.0
    ids = torch.tensor(prompt)
    device = next(model.parameters()).device
    for side in (False, True) if speculative else (False,):
        _, first = timed(lambda: generate(model, ids, 1, speculative=side), device)
        _, longer = timed(lambda: generate(model, ids, 1 + PROBE_TOKENS, speculative=side), device)
        prefill_s += first.wall_s
        per_token_s += max(longer.wall_s - first.wall_s, 0.0) / PROBE_TOKENS
    return prefill_s, per_token_s


def shrink(value: int, floor: int, plan: DecodePlan, setting: str) -> int:
    """The largest value of `setting` in [floor, value] whose plan fits the budget (floor when none does), by
    bisection: the cost grows with every setting."""
    low, high = min(floor, value), value
    while low < high:
        middle = (low + high + 1) // 2
        fits = plan.cost(**{**current(plan), setting: middle}) <= plan.budget_s
        low, high = (middle, high) if fits else (low, middle - 1)
    return low


def current(plan: DecodePlan) -> dict:
    return {"prompts": plan.prompts, "new_tokens": plan.new_tokens, "repeats": plan.repeats}


def plan_decoding(model, probe_prompt: list[int], prompts: int, new_tokens: int, repeats: int, passes: int,
                  budget_s: float | None) -> DecodePlan:
    """The evaluation that fits `budget_s` (None: the one asked for), from a probe of this model's costs."""
    prefill_s, per_token_s = probe_costs(model, probe_prompt, model.head.can_draft)
    return fit_budget(DecodePlan(prompts, new_tokens, repeats, passes, prefill_s, per_token_s, budget_s, (prompts, new_tokens, repeats)))


def fit_budget(plan: DecodePlan) -> DecodePlan:
    """Shrink `plan` in the module's order until its expected time fits its budget (or every floor is reached)."""
    if plan.budget_s is None or plan.expected_s <= plan.budget_s:
        return plan
    for setting, floor in (("repeats", 1), ("prompts", MIN_PROMPTS), ("new_tokens", MIN_NEW_TOKENS), ("prompts", 1)):
        setattr(plan, setting, shrink(getattr(plan, setting), floor, plan, setting))
        if plan.expected_s <= plan.budget_s:
            break
    return plan


def budget_seconds(budget, training_s: float | None) -> float | None:
    """`auto`: the training time (None when unmeasured); a number: that many seconds; None: no budget."""
    if budget is None:
        return None
    if budget == "auto":
        return training_s
    seconds = float(budget)
    return seconds if math.isfinite(seconds) else None

"""The output law of decoding, computed exactly by enumerating every random choice the real decoder makes.

`generate` takes every random decision through one draw source (`sample(probs)` for a
categorical draw, `accept(probability)` for an acceptance coin). `Enumerator` replays a
script of choices through the real decoder and branches at each new decision over every
outcome of positive probability, so the runs cover every proposal and every
accept/reject branch once, each with its probability (float64 products of the very
numbers the decoder used). Summed per output, that is the law of the decoder's output;
it must equal the law of plain sampling computed from no-cache full forwards to 1e-12,
for plain decoding, speculative chains on every head (DeepSeek D = 1, 2, reused
modules, several draft-step counts) and speculative trees on every independent head.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import lab.decode_core.acceptance as acceptance
from lab.decode import generate
from tests.head_cases import case, split, without
from tests.helpers import float64_throughout, make_batch, model_config
from lab.model.heads import head_config
from lab.model.mtp import MTPModel
from tests.test_speculative import exact_law

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread

VOCAB = 3
PROMPT = [2, 0, 1, 1]
HEADS = {  # every drafting head (ntp drafts nothing)
    **without("ntp", "deepseek"),  # deepseek: by depth below
    "linear_replicated": case("linear", unembedding="replicated"),
    "deepseek_d1": case("deepseek", 2),
    "deepseek_d2": case("deepseek"),
    "deepseek_d2_shared": case("deepseek", share_depth_weights=True),
}
INDEPENDENT = [h for h in HEADS if not h.startswith("deepseek")]


def tiny(head: str, seed: int = 3):
    name, k, extra = split(HEADS[head])
    torch.manual_seed(seed)
    cfg = model_config(2, vocab=VOCAB, d_model=8)
    return MTPModel(cfg, head_config({"name": name, "k": k, "compute_match": "none", **extra})).double().eval()


class Enumerator:
    """A draw source that follows `script` (option indices), then takes option 0 at every new decision
    and records how many options it had, so the caller can enumerate the siblings."""

    def __init__(self, script: list[int]):
        self.script, self.taken, self.widths, self.probability = script, [], [], 1.0
        self.rejections = 0

    def _choose(self, options: list[tuple[object, float]]):
        i = len(self.taken)
        pick = self.script[i] if i < len(self.script) else 0
        self.taken.append(pick), self.widths.append(len(options))
        value, probability = options[pick]
        self.probability *= probability
        return value

    def sample(self, probs: torch.Tensor) -> int:
        return self._choose([(t, p) for t, p in enumerate(probs.tolist()) if p > 0])

    def accept(self, probability: float) -> bool:
        options = [(True, probability), (False, 1.0 - probability)]
        accepted = self._choose([o for o in options if o[1] > 0])
        self.rejections += not accepted
        return accepted


def enumerated_law(run) -> tuple[dict[tuple, float], int, int]:
    """(law of `run(draws).tokens`, number of runs, rejections seen) over every branch of the decoder's choices.

    The runs go under `float64_throughout` (a float64 model's float32 pieces, e.g. transformers' RMSNorm and
    routers, in float64 too): the law is held to 1e-12 against `exact_law`'s full forwards, another code path."""
    law: dict[tuple, float] = {}
    stack, runs, rejections = [[]], 0, 0
    while stack:
        script = stack.pop()
        draws = Enumerator(script)
        with float64_throughout():
            tokens = tuple(run(draws).tokens)
        law[tokens] = law.get(tokens, 0.0) + draws.probability
        runs, rejections = runs + 1, rejections + draws.rejections
        for i in range(len(script), len(draws.taken)):  # siblings of every new decision
            stack.extend(draws.taken[:i] + [alt] for alt in range(1, draws.widths[i]))
    return law, runs, rejections


def speculative_law(model, prompt: list[int], n: int, **options) -> tuple[dict[tuple, float], list, int]:
    """(law, every run's Generation, rejections) of speculative sampling at T = 1 with `options`, enumerated."""
    from lab.decode import generate

    runs = []

    def run(draws):
        runs.append(generate(model, torch.tensor(prompt), n, temperature=1.0, speculative=True, draws=draws, **options))
        return runs[-1]

    law, _, rejections = enumerated_law(run)
    return law, runs, rejections


def law_case(head: str, options: dict, prompt: list[int], n: int = 3) -> tuple[dict, list, int, dict]:
    """A drafter's case on the tiny `head` model: (its enumerated law, every run, rejections, the plain law it must equal)."""
    model = tiny(head)
    law, runs, rejections = speculative_law(model, prompt, n, **options)
    return law, runs, rejections, plain_law(model, prompt, n)


def plain_law(model, prompt: list[int], n: int, temperature: float = 1.0) -> dict[tuple, float]:
    """P(x_1..x_n) = Π softmax(logits / T)(x_i) from no-cache full forwards over prompt + x_<i."""
    return exact_law(model, prompt, n, temperature, VOCAB)


def assert_same_law(law: dict, expected: dict) -> None:
    assert abs(sum(law.values()) - 1.0) < 1e-12
    for tokens in set(law) | set(expected):
        assert abs(law.get(tokens, 0.0) - expected.get(tokens, 0.0)) < 1e-12, (tokens, law.get(tokens), expected.get(tokens))


@pytest.fixture(scope="module")
def laws():
    """The plain law per head model and output length (full forwards, computed once)."""
    cache = {}

    def get(head: str, n: int):
        if (head, n) not in cache:
            cache[head, n] = plain_law(tiny(head), PROMPT, n)
        return cache[head, n]

    return get


def test_plain_sampling_law_by_enumeration(laws):
    model = tiny("parallel")
    law, runs, _ = enumerated_law(lambda draws: generate(model, torch.tensor(PROMPT), 3, temperature=1.0, draws=draws))
    assert runs == VOCAB**3
    assert_same_law(law, laws("parallel", 3))


CHAIN_CASES = [(head, steps) for head in INDEPENDENT for steps in (None,)] + [
    ("deepseek_d1", None), ("deepseek_d1", 2), ("deepseek_d2", None), ("deepseek_d2", 1), ("deepseek_d2_shared", None), ("deepseek_d2_shared", 3),
]


@pytest.mark.parametrize("head,steps", CHAIN_CASES)
def test_speculative_chain_keeps_the_exact_law(head, steps, laws):
    model = tiny(head)
    law, runs, rejections = enumerated_law(
        lambda draws: generate(model, torch.tensor(PROMPT), 3, temperature=1.0, speculative=True, draft_steps=steps, draws=draws))
    assert rejections > 0 and runs > VOCAB**3  # drafts were proposed and the residual branch ran
    assert_same_law(law, laws(head, 3))


TREES = {"widths_2_2": [2, 2], "widths_3_1": [3, 1], "paths": [[0, 0], [0, 1], [1]]}


# Every head with one tree shape (shapes rotate over heads) by default; the rest of the cross product is slow (~10 s each).
TREE_CASES = [
    pytest.param(head, tree, marks=() if tree == sorted(TREES)[i % len(TREES)] else pytest.mark.slow)
    for i, head in enumerate(INDEPENDENT) for tree in sorted(TREES)
]


@pytest.mark.parametrize("head,tree", TREE_CASES)
def test_speculative_tree_keeps_the_exact_law(head, tree, laws):
    model = tiny(head)
    law, runs, rejections = enumerated_law(
        lambda draws: generate(model, torch.tensor(PROMPT), 3, temperature=1.0, speculative=True, tree=TREES[tree], draws=draws))
    assert rejections > 0
    assert_same_law(law, laws(head, 3))


def test_tree_law_under_top_k_and_temperature():
    """top_k = 2 leaves fewer candidates than a width of 3 asks for (the tree is pruned), at T = 0.7."""
    model = tiny("parallel")
    expected = {}
    for continuation in itertools.product(range(VOCAB), repeat=3):
        probability, sequence = 1.0, list(PROMPT)
        for token in continuation:
            with float64_throughout():  # as enumerated_law runs the decoder
                logits = model.next_token_logits(make_batch([sequence], [[0] * len(sequence)]))[0, -1].double() / 0.7
            kth = logits.topk(2).values[-1]
            probability *= logits.masked_fill(logits < kth, float("-inf")).softmax(-1)[token].item()
            sequence.append(token)
        expected[continuation] = probability
    law, _, rejections = enumerated_law(
        lambda draws: generate(model, torch.tensor(PROMPT), 3, temperature=0.7, top_k=2, speculative=True, tree=[3, 2], draws=draws))
    assert rejections > 0
    assert_same_law(law, expected)


def test_a_wrong_residual_is_caught(monkeypatch):
    """The check has teeth: redrawing from the target itself after a rejection (not the residual) changes the law."""
    model = tiny("parallel")
    monkeypatch.setattr(acceptance, "residual", lambda p, q: p)
    law, _, rejections = enumerated_law(lambda draws: generate(model, torch.tensor(PROMPT), 3, temperature=1.0, speculative=True, draws=draws))
    assert rejections > 0 and abs(sum(law.values()) - 1.0) < 1e-12
    expected = plain_law(model, PROMPT, 3)
    assert max(abs(law.get(t, 0.0) - expected[t]) for t in expected) > 1e-3

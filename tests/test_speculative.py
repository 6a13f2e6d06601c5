"""Exact self-speculative decoding (lab/decode: proposers, acceptance, generate, ledger)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
import torch

from lab.decode import generate, select_mtp_one
from lab.decode.generate import Decoder
from lab.errors import ConfigError
from lab.decode_core.acceptance import select
from lab.decode_core.sampling import TokenChooser, sample, uniform
from lab.decode_core.target import CachedModel
from lab.model.heads import head_config
from lab.model.mtp import MTPModel
from tests.head_cases import case, split, without
from tests.helpers import committed_kv, float64_throughout, horizon_sums, make_batch, model_config
from tests.test_generate import chi_square_p_value

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread

HEADS = {  # every drafting head (ntp drafts nothing; identity: tests/test_decode_law.py)
    **without("ntp", "identity", "deepseek"),  # deepseek: by depth below
    "linear": case("linear", 4),
    "linear_replicated": case("linear", unembedding="replicated"),
    "parallel": case("parallel", 4),
    "deepseek_d1": case("deepseek", 2),
    "deepseek_d2": case("deepseek"),
    "deepseek_d2_shared": case("deepseek", share_depth_weights=True),
    "medusa": case("medusa", 4, n_layers=2),
    "medusa_replicated": case("medusa", unembedding="replicated"),
}


def model64(head: str, seed: int = 0, vocab: int | None = None, d_model: int = 16):
    name, k, extra = split(HEADS[head])
    torch.manual_seed(seed)
    cfg = model_config(4, vocab=vocab or 37, d_model=d_model)
    # next_token_path matching (the helpers' default): 4 layers carry K = 4 block heads on a 4-layer trunk path.
    return MTPModel(cfg, head_config({"name": name, "k": k, "compute_match": "next_token_path", **extra})).double().eval()


def fit_counting(model, steps: int = 30, vocab: int = 37, seed: int = 0):
    """A few Adam steps on counting sequences (stride 1 or 2): drafts then agree often, but not always."""
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        starts, strides = torch.randint(0, vocab, (8, 1), generator=g), torch.randint(1, 3, (8, 1), generator=g)
        tokens = (starts + strides * torch.arange(16)) % vocab  # [8, 16]
        optimizer.zero_grad()
        sum(horizon_sums(model(make_batch(tokens, torch.zeros_like(tokens))))).backward()
        optimizer.step()
    return model.eval()


def draft_steps_for(head: str) -> list:
    if not head.startswith("deepseek"):
        return [None, 1]
    depth = HEADS[head]["depth"]
    return sorted({1, depth, depth + 2}) + [None]


# --------------------------------------------------------------------------- greedy identity


@pytest.mark.parametrize("head", sorted(HEADS))
def test_greedy_speculative_equals_plain_greedy(head):
    assert_greedy_speculative_equals_plain(fit_counting(model64(head)), draft_steps_for(head), head)


def assert_greedy_speculative_equals_plain(model, draft_steps: list, head: str) -> None:
    """Same tokens for every draft budget, every token emitted, fewer target forwards than plain decoding,
    and both accepted and rejected drafts over three prompts (tests/test_hf_decode.py runs it on HF trunks)."""
    accepted = rejected = 0
    for seed, length in ((0, 1), (1, 6), (2, 11)):
        prompt = torch.randint(0, 37, (length,), generator=torch.Generator().manual_seed(seed))
        plain = generate(model, prompt, 40)
        for steps in draft_steps:
            spec = generate(model, prompt, 40, speculative=True, draft_steps=steps)
            assert spec.tokens == plain.tokens, f"{head} draft_steps={steps} prompt {seed}"
            s = spec.stats
            assert s["emitted"] == 40 and sum(s["emitted_by_round"]) + 1 == 40
            assert s["target_forwards"] == s["rounds"] + 1 < plain.stats["target_forwards"] or s["rounds"] == 39
            accepted += sum(s["accepted_by_position"])
            rejected += sum(p - a for p, a in zip(s["proposed_by_position"], s["accepted_by_position"]))
    assert accepted > 0 and rejected > 0  # both branches of the selector ran


def test_greedy_speculative_stops_at_eos_and_budget():
    model = model64("parallel")
    prompt = torch.tensor([5, 6, 7])
    plain = generate(model, prompt, 40).tokens
    for eos in (plain[3], plain[17]):
        stop = plain.index(eos)
        spec = generate(model, prompt, 40, speculative=True, eos=eos)
        assert spec.tokens == plain[: stop + 1]
    for budget in (1, 2, 3, 5):
        assert generate(model, prompt, budget, speculative=True).tokens == plain[:budget]


# --------------------------------------------------------------------------- exact sampling


def exact_law(model, prompt: list[int], n: int, temperature: float, vocab: int) -> dict[tuple, float]:
    """P(first n tokens) = Π p(x_i | prompt, x_<i) from no-cache full forwards (float64 end to end for a float64 model:
    `float64_throughout`, as `tests.test_decode_law.enumerated_law` runs the decoder it is compared with to 1e-12)."""
    law = {}
    for continuation in itertools.product(range(vocab), repeat=n):
        probability, sequence = 1.0, list(prompt)
        for token in continuation:
            with float64_throughout():
                logits = model.next_token_logits(make_batch([sequence], [[0] * len(sequence)]))[0, -1]
            probability *= (logits.double() / temperature).softmax(-1)[token].item()
            sequence.append(token)
        law[continuation] = probability
    return law


@pytest.mark.parametrize("head", ["parallel", "deepseek_d2"])
def test_speculative_sampling_keeps_the_law_of_plain_sampling(head):
    assert_speculative_law(model64(head, seed=5, vocab=4, d_model=8), vocab=4)


def assert_speculative_law(model, vocab: int, n: int = 3, samples: int = 2000) -> None:
    """Speculative sampling at temperature 1 draws the first n tokens with the exact plain law (chi-square)."""
    prompt = [1, 3, 0, 2]
    law = exact_law(model, prompt, n, 1.0, vocab)
    cells = list(law)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(len(cells), dtype=torch.float64)
    rejections = 0
    for _ in range(samples):
        out = generate(model, torch.tensor(prompt), n, temperature=1.0, speculative=True, generator=generator)
        counts[cells.index(tuple(out.tokens))] += 1
        rejections += sum(p - a for p, a in zip(out.stats["proposed_by_position"], out.stats["accepted_by_position"]))
    expected = torch.tensor([law[c] for c in cells], dtype=torch.float64)
    assert rejections > samples // 4  # the residual rule is exercised, not just acceptances
    assert chi_square_p_value(counts, expected) > 1e-3


# --------------------------------------------------------------------------- select_mtp_one


def argmax_sample(distribution):
    return max(range(len(distribution)), key=lambda i: distribution[i])


def test_select_mtp_one_accepts_with_a_bonus():
    p, q, bonus = [0.5, 0.3, 0.2], [0.25, 0.5, 0.25], [0.1, 0.1, 0.8]
    result = select_mtp_one(p, q, 0, bonus, 0.99, argmax_sample, remaining=5)  # p/q = 2: always accepted
    assert result == {"accepted": True, "new_tokens": [0, 2], "target_rows_to_keep": 2, "pending_frontier": 2, "stopped": False}
    # p(1)/q(1) = 0.6: accepted iff u < 0.6
    assert select_mtp_one(p, q, 1, bonus, 0.59, argmax_sample, remaining=5)["accepted"]


def test_select_mtp_one_rejects_with_the_normalised_residual():
    seen = []

    def record(distribution):
        seen.append(distribution)
        return argmax_sample(distribution)

    p, q = [0.5, 0.3, 0.2], [0.2, 0.5, 0.3]
    result = select_mtp_one(p, q, 1, [1.0, 0.0, 0.0], 0.6, record, remaining=5)
    # residual = max(p - q, 0) = [0.3, 0, 0] -> normalised [1, 0, 0]
    assert seen == [pytest.approx([1.0, 0.0, 0.0])]
    assert result == {"accepted": False, "new_tokens": [0], "target_rows_to_keep": 1, "pending_frontier": 0, "stopped": False}
    p, q = [0.4, 0.4, 0.2], [0.1, 0.8, 0.1]
    select_mtp_one(p, q, 1, [1.0, 0.0, 0.0], 0.9, record, remaining=5)
    assert seen[-1] == pytest.approx([0.3 / 0.4, 0.0, 0.1 / 0.4])


def test_select_mtp_one_eos_and_last_slot_get_no_bonus():
    p, q, bonus = [0.5, 0.5], [0.5, 0.5], [0.0, 1.0]
    eos = select_mtp_one(p, q, 0, bonus, 0.1, argmax_sample, remaining=5, eos=0)
    assert eos == {"accepted": True, "new_tokens": [0], "target_rows_to_keep": 2, "pending_frontier": None, "stopped": True}
    last = select_mtp_one(p, q, 1, bonus, 0.1, argmax_sample, remaining=1)
    assert last == {"accepted": True, "new_tokens": [1], "target_rows_to_keep": 2, "pending_frontier": None, "stopped": True}
    rejected_last = select_mtp_one([1.0, 0.0], [0.5, 0.5], 1, bonus, 0.1, argmax_sample, remaining=1)
    assert rejected_last["new_tokens"] == [0] and rejected_last["stopped"] and rejected_last["pending_frontier"] == 0
    eos_correction = select_mtp_one([1.0, 0.0], [0.5, 0.5], 1, bonus, 0.1, argmax_sample, remaining=5, eos=0)
    assert eos_correction["stopped"] and eos_correction["new_tokens"] == [0]
    bonus_eos = select_mtp_one(p, q, 0, bonus, 0.1, argmax_sample, remaining=5, eos=1)
    assert bonus_eos["new_tokens"] == [0, 1] and bonus_eos["stopped"]


@pytest.mark.parametrize(
    "change",
    [
        {"remaining": 0}, {"remaining": True}, {"remaining": 2.0},
        {"p": [0.5, 0.5, 0.0, 0.0]}, {"q": []}, {"p": [1.2, -0.2]}, {"bonus_p": [float("nan"), 1.0]}, {"q": [0.5, 0.49]},
        {"y": 2}, {"y": -1}, {"y": True}, {"y": 1.0}, {"y": 1, "q": [1.0, 0.0]},
        {"u": 1.0}, {"u": -0.01},
    ],
)
def test_select_mtp_one_refuses_contract_violations(change):
    args = {"p": [0.6, 0.4], "q": [0.5, 0.5], "y": 1, "bonus_p": [0.5, 0.5], "u": 0.3, "remaining": 3, **change}
    with pytest.raises(ValueError):
        select_mtp_one(args["p"], args["q"], args["y"], args["bonus_p"], args["u"], argmax_sample, remaining=args["remaining"])


def test_runtime_selector_equals_select_mtp_one_for_one_proposal():
    """The decoder's tensor selector, given the same uniform and sampling stream, decides exactly as the contract."""
    chooser_seed = torch.Generator().manual_seed(0)
    outcomes = set()
    for case in range(300):
        logits = torch.randn(2, 6, generator=chooser_seed, dtype=torch.float64) * 2  # target rows for f and y
        q = torch.randn(6, generator=chooser_seed, dtype=torch.float64).softmax(-1)
        y = int(torch.multinomial(q, 1, generator=chooser_seed))
        runtime = TokenChooser(1.0, None, torch.Generator().manual_seed(case))
        accepted, following = select([y], [q], logits, runtime)
        contract_stream = torch.Generator().manual_seed(case)
        p = logits.softmax(-1)
        decision = select_mtp_one(p[0].tolist(), q.tolist(), y, p[1].tolist(), uniform(contract_stream),
                                  lambda d: sample(torch.tensor(d, dtype=torch.float64), contract_stream), remaining=2)
        assert decision["accepted"] == bool(accepted)
        assert decision["new_tokens"] == ([y, following] if accepted else [following])
        assert decision["target_rows_to_keep"] == 1 + accepted
        outcomes.add(decision["accepted"])
    assert outcomes == {True, False}


# --------------------------------------------------------------------------- cache transaction


class CheckedDecoder(Decoder):
    """Checks after every round: only verified rows committed, no draft row of a rejected token kept."""

    def round(self, tokens, frontier, out, remaining):
        following = super().round(tokens, frontier, out, remaining)
        caches = self.state.caches
        self.checks += 1
        for key, cache in caches.caches.items():
            assert cache.provisional == 0, key
            if key[0] == "step":  # DeepSeek draft step s: rows whose teacher tokens are all emitted output
                assert cache.committed <= len(tokens) - key[1] + 1, key
            else:  # trunk and every head stack: exactly the committed tokens
                assert cache.committed == len(tokens), key
        return following


def plain_decode_state(model, prompt: list[int], committed: list[int]) -> CachedModel:
    """The caches of a plain decode of the same committed tokens: prefill, then one token per forward."""
    plain = CachedModel(model)
    plain.forward(prompt)
    plain.commit(family=None)
    for token in committed[len(prompt) :]:
        plain.forward([token])
        plain.commit(family=None)
    return plain


@pytest.mark.parametrize("head", ["parallel", "causal", "anticausal", "deepseek_d2"])
def test_committed_caches_equal_a_plain_decode_of_the_committed_tokens(head):
    model = model64(head)
    prompt = [3, 5, 7, 11, 2, 9]
    decoder = CheckedDecoder(model, TokenChooser(1.0, None, torch.Generator().manual_seed(1)), True, None, None)
    decoder.checks = 0
    with torch.no_grad():
        out = decoder.run(prompt, 30)
        rejections = sum(p - a for p, a in zip(out.stats["proposed_by_position"], out.stats["accepted_by_position"]))
        assert decoder.checks > 0 and rejections > 0
        committed = (prompt + out.tokens)[: decoder.state.length]
        plain = plain_decode_state(model, prompt, committed)
        for key, cache in plain.caches.caches.items():
            mine = decoder.state.caches.caches[key]
            assert mine.committed == cache.committed == len(committed)
            for (k1, v1), (k2, v2) in zip(committed_kv(mine), committed_kv(cache)):
                # Equal up to BLAS summation order (a 1-row and an n-row product differ by ~1e-15): float64 but for the
                # rotary cos/sin, float32 and elementwise from integer positions, so the same bits on both paths.
                torch.testing.assert_close(k1, k2, atol=1e-12, rtol=0)
                torch.testing.assert_close(v1, v2, atol=1e-12, rtol=0)


# --------------------------------------------------------------------------- ledger


def test_ledger_identity_for_the_one_proposal_deepseek_round():
    model = model64("deepseek_d1", seed=2)
    stats_all = []
    for seed in range(4):
        out = generate(model, torch.tensor([4, 9, 1, 7]), 50, temperature=1.0, speculative=True, generator=torch.Generator().manual_seed(seed))
        stats_all.append(out.stats)
    emitted, accepted, stopped = (sum((s[key] for s in stats_all), []) for key in ("emitted_by_round", "accepted_by_round", "stopped_by_round"))
    nonterminal = [i for i, stop in enumerate(stopped) if not stop]
    assert {emitted[i] for i in nonterminal} == {1, 2}  # reject: correction; accept: proposal + bonus
    proposals = len(nonterminal)  # one proposal per round
    mean_r = Fraction(sum(emitted[i] for i in nonterminal), proposals)
    acceptance = Fraction(sum(accepted[i] for i in nonterminal), proposals)
    assert mean_r == 1 + acceptance and 0 < acceptance < 1
    # The bootstrap token is counted once per request, outside the rounds.
    assert all(s["emitted"] == 1 + sum(s["emitted_by_round"]) for s in stats_all)


# --------------------------------------------------------------------------- identity heads and leap offsets


def test_identity_heads_draft_through_the_independent_proposer():
    """Identity horizons draft with the next-token logits at the last row: exact, and every slot is proposed."""
    torch.manual_seed(0)
    model = MTPModel(model_config(4), head_config({"name": "identity", "k": 3})).double()
    model = fit_counting(model)
    for seed, length in ((0, 1), (1, 6)):
        prompt = torch.randint(0, 37, (length,), generator=torch.Generator().manual_seed(seed))
        plain = generate(model, prompt, 24)
        spec = generate(model, prompt, 24, speculative=True)
        assert spec.tokens == plain.tokens
        assert spec.stats["proposed_by_position"][0] > 0 and len(spec.stats["proposed_by_position"]) == 2


def test_speculative_refuses_leap_offsets_in_one_line():
    torch.manual_seed(0)
    model = MTPModel(model_config(4), head_config({"name": "parallel", "k": 3, "offsets": [1, 3, 5],
                                                   "compute_match": "next_token_path"})).eval()
    with pytest.raises(ConfigError, match=r"^speculative: head\.offsets=\[1, 3, 5\] leave draft slots without a head") as error:
        generate(model, torch.tensor([1, 2, 3]), 4, speculative=True)
    assert "\n" not in str(error.value)
    assert len(generate(model, torch.tensor([1, 2, 3]), 4).tokens) == 4  # plain decoding still works

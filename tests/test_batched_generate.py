"""Batched requests (lab/decode/batched.py): B prompts of different lengths decoded together equal B single
generations, token for token under greedy decoding and per row in law under sampling."""

from __future__ import annotations

import pytest
import torch

from lab.decode import generate
from lab.decode.batched import decode_rows
from lab.errors import ConfigError
from lab.decode_core.sampling import TokenChooser, distribution
from tests.head_cases import case, cases, split, without
from tests.helpers import build_model, make_batch

pytestmark = pytest.mark.usefixtures("single_thread")

HEADS = {**cases(), "anticausal": case("anticausal", 2)}  # every registered head
PROMPTS = [[5, 1, 7, 2, 9, 3, 8], [4], [11, 6, 2], [3, 3, 12, 7, 1]]


def model_for(name, k, extra, seed=0):
    model = build_model(name, k, seed=seed, layers=4, tie=False, **extra).double().eval()
    with torch.no_grad():  # larger block weights: random tiny models otherwise repeat one token greedily
        for param_name, param in model.named_parameters():
            if param.dim() == 2 and "embed" not in param_name:
                param.mul_(4.0)
    return model


@pytest.mark.parametrize("name,k,extra", map(split, HEADS.values()), ids=list(HEADS))
def test_greedy_batch_equals_single_generations(name, k, extra):
    model = model_for(name, k, extra)
    single = [generate(model, torch.tensor(p), 10).tokens for p in PROMPTS]
    batched = generate(model, [torch.tensor(p) for p in PROMPTS], 10)
    assert [g.tokens for g in batched] == single
    assert len({tuple(t) for t in single}) > 1 and any(len(set(t)) > 2 for t in single)  # not one repeated token everywhere
    same_length = generate(model, torch.tensor([p[:1] + p[-2:] for p in (PROMPTS[0], PROMPTS[2], PROMPTS[3])]), 6)  # a [B, P] tensor
    assert [g.tokens for g in same_length] == [generate(model, torch.tensor(p[:1] + p[-2:]), 6).tokens for p in (PROMPTS[0], PROMPTS[2], PROMPTS[3])]


def test_each_row_stops_at_its_own_eos_and_budget():
    model = model_for("parallel", 3, {})
    free = [generate(model, torch.tensor(p), 10).tokens for p in PROMPTS]
    row, stop = next((r, i) for r, out in enumerate(free) for i in range(2, 10) if out[i] not in out[:i])  # a first occurrence
    eos = free[row][stop]  # that row stops after stop + 1 tokens; the others wherever they produce it
    batched = generate(model, [torch.tensor(p) for p in PROMPTS], 10, eos=eos)
    assert [g.tokens for g in batched] == [generate(model, torch.tensor(p), 10, eos=eos).tokens for p in PROMPTS]
    assert len(batched[row].tokens) == stop + 1 == batched[row].stats["emitted"] and batched[row].stats["mean_accept_len"] == 1.0
    assert any(len(g.tokens) == 10 for g in batched)  # and another row ran to its budget meanwhile
    assert generate(model, [torch.tensor(p) for p in PROMPTS], 0)[1].tokens == []


def test_a_plain_batch_counts_the_target_forwards_it_shared():
    """Every request rides on the batch's passes: the prefill and one step per further token of the longest output
    (the ledger once reported 0 here while its tokens per forward read the batch's count)."""
    model = model_for("parallel", 3, {})
    batched = generate(model, [torch.tensor(p) for p in PROMPTS], 10)
    for g in batched:
        assert (g.stats["target_forwards"], g.stats["rounds"], g.stats["emitted"]) == (10, 9, 10)
        assert g.stats["tokens_per_forward"] == 1.0 == g.stats["mean_accept_len"]


class RecordingChooser(TokenChooser):
    """The real sampler; keeps every [B, V] distribution it draws from."""

    def __init__(self, *args):
        super().__init__(*args)
        self.seen: list[torch.Tensor] = []

    def probs(self, logits):
        probs = super().probs(logits)
        self.seen.append(probs)
        return probs


@pytest.mark.parametrize("name,k,extra", [("ntp", 1, {}), ("parallel", 3, {}), ("deepseek", 3, {"depth": 2})], ids=["ntp", "parallel", "deepseek"])
def test_sampled_rows_are_drawn_from_the_single_request_law(name, k, extra):
    """Every row's every draw comes from the distribution a single request has after the same prefix (float64, 1e-12)."""
    model = model_for(name, k, extra)
    chooser = RecordingChooser(0.9, 7, torch.Generator().manual_seed(3))  # one generator, rows draw in turn
    with torch.no_grad():
        outputs = decode_rows(model, [torch.tensor(p) for p in PROMPTS], 6, [chooser] * len(PROMPTS), eos=None)
    assert len(chooser.seen) == 6 * len(PROMPTS)  # step-major, rows in order
    for b, (prompt, (tokens, _)) in enumerate(zip(PROMPTS, outputs)):
        for step in range(6):
            prefix = prompt + tokens[:step]
            full = model.next_token_logits(make_batch([prefix], [[0] * len(prefix)]))[0, -1]  # [V] no cache, no padding
            expected = distribution(full, 0.9, 7)
            # 1e-12 on any CPU: float64 but for the rotary cos/sin (float32, elementwise from each row's own positions:
            # the same bits padded or not); left padding changes only float64 summation order
            assert torch.allclose(chooser.seen[step * len(PROMPTS) + b], expected, rtol=0, atol=1e-12), (b, step)
            assert expected[tokens[step]] > 0  # the draw lies in the row's own top-7 support


INDEPENDENT = {**without("ntp", "deepseek"), "linear": case("linear", 4)}  # every head drafting its horizons independently


@pytest.mark.parametrize("name,k,extra", map(split, INDEPENDENT.values()), ids=list(INDEPENDENT))
def test_speculative_batch_equals_single_requests_greedy_and_sampled(name, k, extra):
    """Greedy: the plain single output. Sampling with one generator per prompt: the single speculative request's
    tokens and acceptance counts (the same draws in the same order), so each row has a single request's law."""
    model = model_for(name, k, extra)
    prompts = [torch.tensor(p) for p in PROMPTS]
    greedy = generate(model, prompts, 12, speculative=True)
    assert [g.tokens for g in greedy] == [generate(model, p, 12).tokens for p in prompts]
    seeds = [11, 12, 13, 14]
    sampled = generate(model, prompts, 12, temperature=1.0, speculative=True, generator=[torch.Generator().manual_seed(s) for s in seeds])
    single = [generate(model, p, 12, temperature=1.0, speculative=True, generator=torch.Generator().manual_seed(s)) for p, s in zip(prompts, seeds)]
    assert [g.tokens for g in sampled] == [g.tokens for g in single]
    for batched_row, alone in zip(sampled, single):
        for key in ("accepted_by_round", "proposed_by_round", "target_forwards", "accept_by_position", "mean_accept_len",
                    "top1_match_by_position", "top1_checked_rounds", "path_accept", "frechet_lower", "frechet_upper"):
            assert batched_row.stats[key] == pytest.approx(alone.stats[key], nan_ok=True), key
    assert sum(sum(g.stats["accepted_by_round"]) for g in sampled) > 0  # drafts were accepted: the kept slots matter
    plain = generate(model, prompts, 8, temperature=1.0, generator=[torch.Generator().manual_seed(s) for s in seeds])
    assert [g.tokens for g in plain] == [generate(model, p, 8, temperature=1.0, generator=torch.Generator().manual_seed(s)).tokens
                                         for p, s in zip(prompts, seeds)]


def test_speculative_batch_stops_rows_at_eos():
    model = model_for("parallel", 3, {})
    prompts = [torch.tensor(p) for p in PROMPTS]
    free = [generate(model, p, 12).tokens for p in prompts]
    row, stop = next((r, i) for r, out in enumerate(free) for i in range(2, 12) if out[i] not in out[:i])
    batched = generate(model, prompts, 12, speculative=True, eos=free[row][stop])
    assert [g.tokens for g in batched] == [generate(model, p, 12, eos=free[row][stop]).tokens for p in prompts]
    assert len(batched[row].tokens) == stop + 1


def test_bad_batches_are_refused_with_one_line():
    model = model_for("parallel", 3, {})
    for name, k, extra in (("deepseek", 3, {"depth": 2}), ("ntp", 1, {})):
        with pytest.raises(ConfigError, match="speculative"):
            generate(model_for(name, k, extra), [torch.tensor([1, 2]), torch.tensor([3])], 4, speculative=True)
    with pytest.raises(ConfigError, match="generator"):
        generate(model, [torch.tensor([1, 2]), torch.tensor([3])], 4, temperature=1.0, generator=[torch.Generator()])
    with pytest.raises(ConfigError, match=r"prompt.*\[0, "):
        generate(model, [torch.tensor([1, 2]), torch.tensor([3, 10_000])], 4)
    with pytest.raises(ConfigError, match="prompt"):
        generate(model, [torch.tensor([1, 2]), torch.tensor([], dtype=torch.long)], 4)
    with pytest.raises(ConfigError, match="prompt"):
        generate(model, [], 4)

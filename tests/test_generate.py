"""`lab.decode.generate` (plain decoding): greedy equals a naive full-forward loop, sampling has the right law."""

from __future__ import annotations

import pytest
import torch

from lab.decode import generate
from lab.errors import ConfigError
from lab.model.heads import HeadConfig
from lab.model.mtp import MTPModel
from tests.head_cases import case, cases, split
from tests.helpers import build_model, make_batch, model_config

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread

HEADS = {**cases(), "anticausal": case("anticausal", 2)}  # every registered head


def model64(head: str, seed: int = 0, **overrides):
    name, k, extra = split(HEADS[head])
    return build_model(name, k, seed=seed, layers=4, **{**extra, **overrides}).double().eval()


def full_logits_after(model, tokens: list[int]) -> torch.Tensor:
    """[V] next-token logits after `tokens`, from a no-cache forward over the whole sequence."""
    return model.next_token_logits(make_batch([tokens], [[0] * len(tokens)]))[0, -1]


def naive_greedy(model, prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    sequence = list(prompt)
    for _ in range(n):
        sequence.append(int(full_logits_after(model, sequence).argmax()))
        if sequence[-1] == eos:
            break
    return sequence[len(prompt) :]


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """Pearson's test of counts against probabilities (cells with expected < 5 pooled)."""
    expected = expected_probs * observed.sum()
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum().reshape(1)]) if small.any() else observed
    exp = torch.cat([expected[~small], expected[small].sum().reshape(1)]) if small.any() else expected
    keep = exp > 0
    statistic = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic.double() / 2))


@pytest.mark.parametrize("head", sorted(HEADS))
def test_greedy_equals_a_naive_full_forward_loop(head):
    model = model64(head)
    for seed, length in ((0, 1), (1, 5), (2, 9)):
        prompt = torch.randint(0, model.model_cfg.vocab_size, (length,), generator=torch.Generator().manual_seed(seed))
        out = generate(model, prompt, 24)
        assert out.tokens == naive_greedy(model, prompt.tolist(), 24)
        assert out.stats["target_forwards"] == 24 and out.stats["emitted"] == 24  # prefill + 23 one-token steps


def test_eos_stops_generation_and_is_included():
    model = model64("parallel")
    prompt = torch.tensor([4, 8, 15, 16])
    free = generate(model, prompt, 30).tokens
    eos = free[5]
    stop = free.index(eos)
    out = generate(model, prompt, 30, eos=eos)
    assert out.tokens == free[: stop + 1] == naive_greedy(model, prompt.tolist(), 30, eos=eos)
    assert generate(model, prompt, 0).tokens == []


def test_sampling_is_reproducible_with_a_generator():
    model = model64("causal")
    prompt = torch.tensor([1, 2, 3])
    runs = [generate(model, prompt, 20, temperature=1.3, generator=torch.Generator().manual_seed(7)).tokens for _ in range(2)]
    other = generate(model, prompt, 20, temperature=1.3, generator=torch.Generator().manual_seed(8)).tokens
    assert runs[0] == runs[1] and runs[0] != other


@pytest.mark.parametrize("temperature,top_k", [(0.7, None), (1.0, 3)])
def test_first_token_law_is_softmax_of_logits_over_temperature(temperature, top_k):
    torch.manual_seed(3)
    model = MTPModel(model_config(2, vocab=7, d_model=8), HeadConfig(name="ntp", k=1)).double().eval()
    prompt = torch.tensor([1, 4, 2])
    logits = full_logits_after(model, prompt.tolist())
    scaled = logits / temperature
    if top_k is not None:
        scaled[scaled < scaled.topk(top_k).values[-1]] = float("-inf")
    expected = scaled.softmax(-1)
    generator = torch.Generator().manual_seed(11)
    counts = torch.zeros(7, dtype=torch.float64)
    for _ in range(2000):
        counts[generate(model, prompt, 1, temperature=temperature, top_k=top_k, generator=generator).tokens[0]] += 1
    assert chi_square_p_value(counts, expected) > 1e-3
    if top_k is not None:
        assert counts[expected == 0].sum() == 0
    # The test can fail: the same counts against softmax(logits) at another temperature are rejected.
    assert chi_square_p_value(counts, (logits / (temperature * 2.5)).softmax(-1)) < 1e-3


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"prompt": torch.tensor([], dtype=torch.long)}, "prompt"),
        ({"prompt": torch.tensor([[[1, 2]]])}, "prompt"),  # [B, P] is a batch (lab.decode.batched); 3-D is nothing
        ({"prompt": torch.tensor([1, 99])}, "prompt"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"draft_steps": 0}, "draft_steps"),
    ],
)
def test_bad_requests_are_refused_with_the_field(kwargs, field):
    model = model64("ntp")
    args = {"prompt": torch.tensor([1, 2]), "max_new_tokens": 3, **kwargs}
    with pytest.raises(ConfigError) as error:
        generate(model, args.pop("prompt"), args.pop("max_new_tokens"), **args)
    assert error.value.field == field


def test_speculative_on_a_head_without_drafts_is_refused():
    with pytest.raises(ConfigError, match="speculative: head 'ntp'"):
        generate(model64("ntp"), torch.tensor([1, 2]), 3, speculative=True)

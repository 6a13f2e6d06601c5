"""Decoding on a transformers trunk: its DynamicCache inside the harness's cache transaction."""

from __future__ import annotations

import pytest
import torch

from lab.decode import generate
from tests.helpers import build_model
from tests.test_speculative import assert_greedy_speculative_equals_plain, fit_counting

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB = 37
HEADS = {
    "linear": ("linear", 3, {}),
    "parallel": ("parallel", 3, {}),
    "causal": ("causal", 3, {}),
    "anticausal": ("anticausal", 3, {}),
    "deepseek_d2": ("deepseek", 3, {"depth": 2}),
    "medusa": ("medusa", 4, {"n_layers": 2}),
    "identity": ("identity", 3, {}),
    # head.block=native: head blocks are the Llama's own decoder layer (lab/model/native_layers.py)
    "parallel_native": ("parallel", 3, {"block": "native"}),
    "causal_native": ("causal", 3, {"block": "native", "n_layers": 2}),
    "anticausal_native": ("anticausal", 3, {"block": "native"}),
    "deepseek_d2_native": ("deepseek", 3, {"depth": 2, "block": "native"}),
}


def hf_model(head: str, seed: int = 0):
    name, k, extra = HEADS.get(head, ("ntp", 1, {}))
    return build_model(name, k, seed=seed, trunk="hf", layers=2, **extra).double().eval()


def test_plain_greedy_equals_transformers_generate():
    model = fit_counting(hf_model("ntp"))
    hf = model.hf_model
    for seed, length in ((0, 1), (1, 7)):
        prompt = torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))
        ours = generate(model, prompt, 30).tokens
        theirs = hf.generate(prompt[None], max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0,
                             attention_mask=torch.ones(1, length, dtype=torch.long))[0, length:].tolist()
        assert ours == theirs


def draft_steps_for(head: str) -> list:
    """As the GPT test (tests/test_speculative.py): DeepSeek also drafts beyond its depth (modules reused)."""
    name, _, extra = HEADS[head]
    return sorted({1, extra["depth"], extra["depth"] + 2}) + [None] if name == "deepseek" else [None, 1]


@pytest.mark.parametrize("head", sorted(HEADS))
def test_speculative_greedy_equals_plain_greedy(head):
    """What the GPT test checks (tests/test_speculative.py), on a transformers trunk."""
    assert_greedy_speculative_equals_plain(fit_counting(hf_model(head)), draft_steps_for(head), head)


@pytest.mark.slow
def test_speculative_sampling_keeps_the_law_on_a_transformers_trunk():
    """Rejected drafts are cropped from the DynamicCache often here; the output law stays exact."""
    from lab.model.mtp import build_model as build
    from tests.helpers import hf_llama_config
    from tests.test_speculative import assert_speculative_law

    torch.manual_seed(5)
    model = build({"name": "hf", "config": hf_llama_config(vocab=4, d_model=8)}, {"name": "parallel", "k": 3}).double().eval()
    assert_speculative_law(model, vocab=4)


def test_trees_and_batched_requests_are_refused_in_one_line_on_a_transformers_trunk():
    """Both run on the harness's own attention (per-node masks, left-padded slots); a DynamicCache holds neither."""
    from lab.errors import ConfigError

    model = hf_model("parallel")
    prompt = torch.tensor([1, 2, 3])
    with pytest.raises(ConfigError, match=r"^tree: draft trees need the harness's GPT trunk"):
        generate(model, prompt, 4, speculative=True, tree=[2, 2])
    with pytest.raises(ConfigError, match=r"^prompt: batched requests need the harness's GPT trunk"):
        generate(model, [prompt, prompt[:2]], 4)

"""Decoding on a transformers trunk: its DynamicCache inside the harness's cache transaction."""

from __future__ import annotations

import pytest
import torch

from lab.decode import generate
from tests.head_cases import case, split, without
from tests.helpers import build_model, committed_kv, float64_throughout
from tests.test_speculative import assert_greedy_speculative_equals_plain, fit_counting

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB = 37
HEADS = {  # every drafting head (ntp drafts nothing)
    **without("ntp", "deepseek"),  # deepseek: by depth below
    "deepseek_d2": case("deepseek"),
    "medusa": case("medusa", 4, n_layers=2),
    # head.block=native: head blocks are the Llama's own decoder layer (lab/nn/native_layers.py)
    "parallel_native": case("parallel", block="native"),
    "causal_native": case("causal", block="native", n_layers=2),
    "anticausal_native": case("anticausal", block="native"),
    "deepseek_d2_native": case("deepseek", block="native"),
}


def hf_model(head: str, seed: int = 0):
    name, k, extra = split(HEADS.get(head, case("ntp")))
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
    name, _, extra = split(HEADS[head])
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


def test_ragged_batches_are_refused_in_one_line_on_a_transformers_trunk():
    """Prompts of different lengths need left-padded slots (the harness's own attention); a DynamicCache batches
    prompts of one length only (tests/test_decode_stop_and_hf_batch.py decodes those)."""
    from lab.errors import ConfigError

    model = hf_model("parallel")
    prompt = torch.tensor([1, 2, 3])
    with pytest.raises(ConfigError, match=r"^prompt: a transformers trunk \(model=hf\) batches prompts of one length only"):
        generate(model, [prompt, prompt[:2]], 4)


# --------------------------------------------------------------------------- draft trees through the transformers model

TREES = [[2, 2], [3, 1], [[0, 0], [0, 1], [1, 0], [2]]]


@pytest.mark.parametrize("head", ["parallel", "linear", "causal_native", "identity"])
def test_tree_greedy_equals_plain_greedy(head):
    model = fit_counting(hf_model(head))
    beyond_top1 = 0
    for seed, length in ((0, 1), (1, 9)):
        prompt = torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))
        plain = generate(model, prompt, 20).tokens
        for tree in TREES:
            out = generate(model, prompt, 20, speculative=True, tree=tree)
            assert out.tokens == plain, tree
            beyond_top1 += out.stats["accepted_beyond_top1"]
    assert beyond_top1 > 0  # some accepted paths went through a sibling: the tree mask and positions mattered


def test_committed_dynamic_cache_after_tree_rounds_equals_a_plain_decode():
    """Only the accepted path's K/V rows stay in the DynamicCache, at their positions: a plain decode of the committed tokens holds the same."""
    from lab.decode.generate import Decoder
    from lab.decode_core.sampling import TokenChooser
    from lab.decode_core.target import TRUNK
    from lab.decode_core.tree import tree_shape
    from tests.test_speculative import plain_decode_state

    model = fit_counting(hf_model("parallel"))
    prompt = [3, 5, 7, 11, 2, 9]
    decoder = Decoder(model, TokenChooser(1.0, None, torch.Generator().manual_seed(1)), True, None, None, tree_shape([3, 2]))
    # float64 end to end (Llama's float32 RMSNorm too): tree passes and one-row passes then differ by float64
    # summation order only (~1e-15), not by a float32 rounding of inputs that differ in their last float64 bits.
    with torch.no_grad(), float64_throughout():
        out = decoder.run(prompt, 24)
        assert out.stats["accepted_beyond_top1"] > 0 and out.stats["tree_nodes"] > out.stats["rounds"] * 2
        committed = (prompt + out.tokens)[: decoder.state.length]
        plain = plain_decode_state(model, prompt, committed)
        mine, theirs = decoder.state.caches.cache(TRUNK), plain.caches.cache(TRUNK)
        assert mine.committed == theirs.committed == mine.length == len(committed)
        for (k1, v1), (k2, v2) in zip(committed_kv(mine), committed_kv(theirs)):
            torch.testing.assert_close(k1, k2, atol=1e-10, rtol=0)
            torch.testing.assert_close(v1, v2, atol=1e-10, rtol=0)


def test_commit_rows_moves_the_path_rows_of_a_dynamic_cache():
    from lab.decode_core.hf_cache import HFTrunkCache

    cache = HFTrunkCache(("trunk",), "target")
    rows = torch.arange(7, dtype=torch.float64).view(1, 1, 7, 1).expand(1, 2, 7, 3).contiguous()  # row i holds i
    cache.dynamic.update(rows.clone(), -rows.clone(), 0)
    cache.committed = 2
    cache.commit_rows([0, 2, 4])  # provisional offsets -> absolute rows 2, 4, 6
    assert cache.committed == cache.length == 5
    assert cache.dynamic.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 4, 6]
    assert cache.dynamic.layers[0].values[0, 1, :, 0].tolist() == [0, -1, -2, -4, -6]
    with pytest.raises(ValueError, match="not increasing offsets"):
        cache.commit_rows([1, 0])


def test_tree_sampling_keeps_the_exact_law_on_a_transformers_trunk():
    """Enumerated over every draw the decoder makes (tests/test_decode_law.py), on a tiny Llama trunk."""
    from lab.model.mtp import build_model as build
    from tests.helpers import hf_llama_config
    from tests.test_decode_law import assert_same_law, enumerated_law
    from tests.test_speculative import exact_law

    torch.manual_seed(3)
    model = build({"name": "hf", "config": hf_llama_config(vocab=3, d_model=8)}, {"name": "linear", "k": 3}).double().eval()
    prompt = [2, 0, 1, 1]
    law, _, rejections = enumerated_law(
        lambda draws: generate(model, torch.tensor(prompt), 3, temperature=1.0, speculative=True, tree=[2, 1], draws=draws))
    assert rejections > 0
    assert_same_law(law, exact_law(model, prompt, 3, 1.0, 3))

"""A stop predicate ends a request without changing the tokens before it, and a transformers trunk decodes a
batch of one prompt length (n samples of one prompt, as pass@k needs) with each row's single-request law."""

import pytest
import torch

from lab.decode import generate
from lab.errors import ConfigError
from lab.model.mtp import build_model

LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1, "initializer_range": 0.2}


@pytest.fixture(scope="module", params=["medusa", "parallel"])
def hf_model(request):
    """The trunk's own next-token path (medusa), or a head block on it (parallel: its stack is the harness's, cached beside)."""
    torch.manual_seed(0)
    return build_model({"name": "hf", "config": LLAMA}, {"name": request.param, "k": 3, "compute_match": "none"}).eval()


@pytest.fixture(scope="module")
def gpt_model():
    torch.manual_seed(0)
    return build_model({"vocab_size": 64, "d_model": 32, "n_layers": 2, "n_heads": 2},
                       {"name": "parallel", "k": 3, "compute_match": "none"}).eval()


PROMPT = torch.tensor([5, 9, 2, 7, 7, 1])


@pytest.mark.parametrize("speculative", [False, True])
def test_a_stop_predicate_cuts_the_same_tokens_short(gpt_model, speculative):
    full = generate(gpt_model, PROMPT, 24, speculative=speculative).tokens
    third = full[2]
    stopped = generate(gpt_model, PROMPT, 24, speculative=speculative, stop=lambda out: third in out[2:]).tokens
    assert stopped == full[: len(stopped)]  # the tokens before the stop are those of the run without it
    if not speculative:
        assert len(stopped) == 3  # plain decoding ends on the very token that made the predicate true
    else:
        assert 3 <= len(stopped) < 24  # a round's accepted drafts may run past it (its text is cut afterwards)


def test_a_stop_predicate_ends_each_row_of_a_batch_on_its_own(gpt_model):
    prompts = [PROMPT, torch.tensor([3, 3, 4])]
    full = [g.tokens for g in generate(gpt_model, prompts, 16)]
    stopped = [g.tokens for g in generate(gpt_model, prompts, 16, stop=lambda out: len(out) >= 4 and out[0] == full[0][0])]
    assert stopped[0] == full[0][:4]
    assert stopped[1] == (full[1][:4] if full[1][0] == full[0][0] else full[1])  # the other row runs to its own end


def test_a_transformers_trunk_batches_samples_of_one_prompt_with_each_rows_single_request_law(hf_model):
    greedy_single = generate(hf_model, PROMPT, 12).tokens
    assert [g.tokens for g in generate(hf_model, [PROMPT] * 3, 12)] == [greedy_single] * 3
    seeds = [11, 12, 13, 14]
    batch = generate(hf_model, [PROMPT] * 4, 12, temperature=1.0, generator=[torch.Generator().manual_seed(s) for s in seeds])
    singles = [generate(hf_model, PROMPT, 12, temperature=1.0, generator=torch.Generator().manual_seed(s)).tokens for s in seeds]
    assert [g.tokens for g in batch] == singles
    assert len({tuple(s) for s in singles}) > 1  # the rows did sample different continuations


def test_sampled_rows_that_stop_early_leave_the_batch_and_the_others_are_unchanged(hf_model):
    seeds = range(21, 27)
    stop = lambda out: 5 in out or 9 in out  # noqa: E731: rows end at different steps
    batch = generate(hf_model, [PROMPT] * 6, 16, temperature=1.0, generator=[torch.Generator().manual_seed(s) for s in seeds], stop=stop)
    singles = [generate(hf_model, PROMPT, 16, temperature=1.0, generator=torch.Generator().manual_seed(s), stop=stop).tokens for s in seeds]
    assert [g.tokens for g in batch] == singles
    assert len({len(tokens) for tokens in singles}) > 1  # they did stop at different steps


@pytest.mark.parametrize("request_args, field", [
    ({"prompt": [PROMPT, torch.tensor([1, 2])]}, "prompt"),
    ({"prompt": [PROMPT, PROMPT], "speculative": True}, "speculative"),
])
def test_a_transformers_trunk_refuses_ragged_or_speculative_batches_in_one_line(hf_model, request_args, field):
    with pytest.raises(ConfigError) as error:
        generate(hf_model, max_new_tokens=4, **request_args)
    assert str(error.value).startswith(field)

"""Replay along a fixed continuation (`generate(..., follow=reference)`, lab/decode/follow.py): every decoder writes the
reference; on plain greedy's own text a replay is the free decoding round for round; a hand-counted loop; the near-ties."""

from __future__ import annotations

import pytest
import torch

from lab.decode import generate
from lab.decode_core.ledger import ledger
from lab.errors import ConfigError
from tests.helpers import build_model
from tests.test_speculative import fit_counting, model64

PROMPT = torch.tensor([3, 4, 5, 6, 3, 4, 5, 6, 3, 4])
DECODERS = {  # head, generate options: every kind of round (plain, chain, tree, lookup, suffix, chosen, gated, a chain of depths)
    "plain": ("parallel", {}),
    "chain": ("parallel", {"speculative": True}),
    "tree": ("parallel", {"speculative": True, "tree": [2, 2]}),
    "ngram": ("parallel", {"speculative": True, "ngram": {"max_draft": 4, "with_heads": False}}),
    "suffix": ("parallel", {"speculative": True, "ngram": {"method": "suffix", "max_draft": 4, "with_heads": False}}),
    "graft": ("parallel", {"speculative": True, "ngram": {"max_draft": 4}}),
    "choose_gated": ("parallel", {"speculative": True, "confidence": 0.3, "ngram": {"max_draft": 4, "combine": "choose", "min_match": 2}}),
    "deepseek": ("deepseek_d2", {"speculative": True}),
}
N = 16


def counts(stats: dict) -> str:
    """The ledger without its times, as text (an empty position's NaN equals itself there)."""
    return repr({key: value for key, value in ledger(stats).items() if "_s_" not in key})


def trained(head: str):
    return fit_counting(model64(head))  # float64: every decoder's free output is plain greedy's


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_a_replay_of_plain_greedy_text_is_the_free_decoding_round_for_round(name):
    head, options = DECODERS[name]
    model = trained(head)
    plain = generate(model, PROMPT, N).tokens
    free = generate(model, PROMPT, N, **options)
    replay = generate(model, PROMPT, N, follow=plain, **options)
    assert free.tokens == plain == replay.tokens
    assert counts(replay.stats) == counts(free.stats)  # the same rounds, drafts and acceptances
    assert replay.stats["drafter_by_round"] == free.stats["drafter_by_round"]
    assert replay.stats["replay_disagreements"] == 0


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_every_decoder_writes_the_reference_and_counts_where_the_target_would_not_have(name):
    """A reference that is plain greedy's text with its last token changed: the target disagrees there and nowhere
    else (every earlier slot has plain's context), so each decoder reports exactly one near-tie."""
    head, options = DECODERS[name]
    model = trained(head)
    plain = generate(model, PROMPT, N).tokens
    reference = [*plain[:-1], (plain[-1] + 1) % 37]
    out = generate(model, PROMPT, N, follow=reference, **options)
    assert out.tokens == reference
    assert out.stats["replay_disagreements"] == 1


def test_a_reference_that_repeats_the_prompt_is_accepted_in_full_whatever_the_model():
    """Prompt 3 4 5 6 3 4 5 6 3 4, reference 5 6 3 4 × 5 (a random model's argmax agrees with none of it):
    prefill emits 5; each round the lookup drafts 4 tokens of the period, all accepted, plus the forced next token —
    5 tokens a round until the budget: rounds of 5, 5, 5, then 4 (the last slot's draft gets no bonus)."""
    model = build_model("ntp").double().eval()
    reference = [5, 6, 3, 4] * 5
    out = generate(model, PROMPT, 20, speculative=True, ngram={"sizes": [2, 1], "max_draft": 4}, follow=reference)
    assert out.tokens == reference
    assert out.stats["target_forwards"] == 1 + 4
    assert out.stats["accepted_by_round"] == [4, 4, 4, 4]


@pytest.mark.parametrize("options,message", [
    ({"temperature": 1.0}, "follow: holds greedy decoding to a reference continuation; it needs temperature=0"),
    ({"max_new_tokens": 21}, "follow: the reference has 20 tokens; it must cover max_new_tokens=21"),
])
def test_a_replay_that_cannot_hold_is_refused_in_one_line(options, message):
    model = build_model("ntp").double().eval()
    with pytest.raises(ConfigError, match=message):
        generate(model, PROMPT, options.pop("max_new_tokens", 8), follow=[1] * 20, **options)


def test_a_batch_refuses_a_replay():
    model = build_model("ntp").double().eval()
    with pytest.raises(ConfigError, match="follow: batched requests decode freely"):
        generate(model, [PROMPT, PROMPT], 4, follow=[1] * 4)


def transformers_replay(model, reference, **lookup) -> tuple[list[int], int, int]:
    """transformers' generate held to `reference`: (tokens, slots held off its argmax, rows its forwards verified)."""
    from lab.decode.follow import TransformersFollow

    hf, rows = model.hf_model, []
    counting = hf.register_forward_hook(lambda module, args, kwargs, output: rows.append(output.logits.shape[1]), with_kwargs=True)
    with TransformersFollow(hf, reference, len(PROMPT)) as held:
        out = hf.generate(PROMPT[None], attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long), max_new_tokens=N,
                          do_sample=False, eos_token_id=None, pad_token_id=0, **lookup)
    counting.remove()
    return out[0, len(PROMPT):].tolist(), held.disagreements, sum(rows[1:])  # rows after the prefill's


@pytest.mark.parametrize("lookup", [{}, {"prompt_lookup_num_tokens": 4, "max_matching_ngram_size": 2}], ids=["plain", "prompt_lookup"])
def test_transformers_generate_held_to_a_reference_writes_it_and_counts_the_same_near_tie(lookup):
    """transformers' own generate (plain and prompt lookup) under the replay's hook: the reference is plain greedy's
    text with its last token changed, so exactly one slot is held against the model's argmax."""
    from tests.test_hf_decode import hf_model

    model = fit_counting(hf_model("ntp"))
    plain = generate(model, PROMPT, N).tokens
    reference = [*plain[:-1], (plain[-1] + 1) % 37]
    tokens, disagreements, _ = transformers_replay(model, reference, **lookup)
    assert tokens == reference and disagreements == 1


def test_transformers_prompt_lookup_still_verifies_the_drafts_it_would_have_verified():
    """A random model's reference: the prompt's repeats are wrong drafts, so prompt lookup verifies rows that are
    rejected (more rows than tokens after the first). Held by a logits processor instead, its candidate generator
    would drop every draft that is not the reference's and verify exactly one row per emitted token."""
    from tests.test_hf_decode import hf_model

    model = hf_model("ntp")
    reference = generate(model, PROMPT, N).tokens
    tokens, _, rows = transformers_replay(model, reference, prompt_lookup_num_tokens=4, max_matching_ngram_size=2)
    assert tokens == reference and rows > N - 1

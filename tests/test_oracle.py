"""The marginal oracle (experiments/benchmarks/marginal_oracle.py): the ceiling of independent heads' training objective.

Oracles: the exact marginal of slots t+2 and t+3 given x≤t, by enumerating every continuation of a
tiny Llama (V = 13: 13 + 169 rows); greedy oracle decoding against a hand-rolled greedy loop. The
estimator must match the enumeration (and the law given one fixed next token must not, so the test can
tell a marginal from a conditional); the oracle's sampled output must have the target's law (its 2nd
and 3rd tokens follow the same marginals), which a misaligned verification row would break.
"""

from __future__ import annotations

import pytest
import torch

from lab.errors import ConfigError
from experiments.benchmarks.marginal_oracle import marginal_laws, oracle_decode
from lab.decode_core.sampling import TokenChooser
from lab.model.mtp import build_model
from tests.helpers import hf_llama_config, make_batch

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB, TEMPERATURE = 13, 0.35
PROMPT = [3, 1, 4, 1, 5]


def oracle_model(head: dict | None = None):
    torch.manual_seed(0)
    trunk = {"name": "hf", "config": hf_llama_config(vocab=VOCAB, d_model=16, n_layers=2)}
    return build_model(trunk, {"name": "medusa", "k": 3, "trunk_grad": "frozen", "compute_match": "none", **(head or {})}).eval()


def laws_after(model, prefixes: list[list[int]]) -> torch.Tensor:
    """[N, V] float64: the target's law (at TEMPERATURE) of the slot after each prefix, by full forwards."""
    with torch.no_grad():
        logits = model.next_token_logits(make_batch(prefixes, [[0] * len(prefixes[0])] * len(prefixes)))[:, -1]  # [N, V]
    return torch.softmax(logits.double() / TEMPERATURE, dim=-1)


def exact_marginals(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The laws of slots t+2 and t+3 given x≤t (PROMPT), summed over every continuation."""
    first = laws_after(model, [PROMPT])[0]  # [V]: slot t+1
    second_given = laws_after(model, [PROMPT + [a] for a in range(VOCAB)])  # [V, V]: row a = law of t+2 after a
    third_given = laws_after(model, [PROMPT + [a, b] for a in range(VOCAB) for b in range(VOCAB)])  # [V*V, V]
    pair = first[:, None] * second_given  # [V, V]: P(t+1 = a, t+2 = b)
    return first @ second_given, pair.reshape(-1) @ third_given


def test_marginal_laws_estimate_the_exact_marginals_not_a_conditional():
    model = oracle_model()
    second, third = exact_marginals(model)
    chooser = TokenChooser(TEMPERATURE, None, torch.Generator().manual_seed(0))
    _, laws = marginal_laws(model.hf_model, PROMPT, depth=2, paths=4000, chooser=chooser)
    assert (laws[0] - second).abs().max() < 0.015 and (laws[1] - third).abs().max() < 0.015
    given_likeliest = laws_after(model, [PROMPT + [int(laws_after(model, [PROMPT])[0].argmax())]])[0]
    assert (given_likeliest - second).abs().max() > 0.05  # over 3x the tolerance: the check tells a conditional from the marginal


def test_sampled_oracle_decoding_has_the_targets_law():
    model = oracle_model()
    second, third = exact_marginals(model)
    generator, runs = torch.Generator().manual_seed(1), 3000
    counts = torch.zeros(2, VOCAB, dtype=torch.float64)
    proposed = 0
    for _ in range(runs):
        out = oracle_decode(model, PROMPT, 3, depth=2, paths=3, chooser=TokenChooser(TEMPERATURE, None, generator))
        counts[0, out["tokens"][1]] += 1
        counts[1, out["tokens"][2]] += 1
        proposed += out["target_forwards"]
    expected = torch.stack([second, third]) * runs  # [2, V]
    chi_square = float(((counts - expected) ** 2 / expected).sum())  # 24 degrees of freedom (2 slots × 12)
    assert chi_square < 51.18, chi_square  # the 0.999 quantile; 28 here, 75 when acceptance uses the first path's law as q
    assert proposed < 3 * runs  # some rounds accepted a draft (3 forwards each would mean none ever passed)


def test_greedy_oracle_is_plain_greedy_with_every_draft_accepted():
    model = oracle_model()
    sequence = list(PROMPT)
    for _ in range(13):
        sequence.append(int(laws_after(model, [sequence])[0].argmax()))
    out = oracle_decode(model, PROMPT, 13, depth=3, paths=2, chooser=TokenChooser(0.0, None, None))
    assert out["tokens"] == sequence[len(PROMPT):]
    assert out["target_forwards"] == 4 and out["tokens_per_forward"] == 13 / 4  # prefill, then 3 rounds of 1 + 3 tokens
    assert out["accept_by_position"] == [1.0, 1.0, 1.0]


def test_a_head_with_its_own_next_token_path_is_refused():
    model = oracle_model()
    parallel = build_model({"name": "hf", "config": hf_llama_config(vocab=VOCAB, d_model=16, n_layers=2)},
                           {"name": "parallel", "k": 2, "n_layers": 1, "trunk_grad": "frozen", "compute_match": "none"})
    with pytest.raises(ConfigError, match="next-token path is its own"):
        oracle_decode(parallel, PROMPT, 4, depth=2, paths=2, chooser=TokenChooser(1.0, None, None))
    assert oracle_decode(model, PROMPT, 4, depth=2, paths=2, chooser=TokenChooser(1.0, None, None))["tokens"]

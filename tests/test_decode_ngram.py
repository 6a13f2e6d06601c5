"""Prompt lookup (lab/decode/ngram.py): the index, the trie graft onto the heads' tree, exactness alone and with heads."""

from __future__ import annotations

import pytest
import torch

import lab.decode_core.acceptance as acceptance
from lab.decode import generate
from lab.decode.ngram import NgramIndex, PromptLookup
from lab.errors import ConfigError
from lab.decode_core.tree import NGRAM_HORIZON, ProposalBuffer, TreeShape
from tests.helpers import build_model
from tests.test_decode_law import assert_same_law, enumerated_law, law_case, tiny
from tests.test_speculative import exact_law, fit_counting, model64

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread


# --------------------------------------------------------------------------- the index


def test_lookup_copies_what_followed_the_latest_earlier_occurrence():
    text = [5, 6, 7, 5, 6, 8, 5, 6]
    # suffix (5, 6) occurred ending at 2 and at 5; the latest wins: text[5:] = [8, 5, 6]
    assert NgramIndex((2, 1)).lookup(text, 3) == [8, 5, 6]
    assert NgramIndex((2, 1)).lookup(text, 1) == [8]
    assert NgramIndex((3,)).lookup(text, 3) == []  # (8, 5, 6) never occurred before
    assert NgramIndex((3, 1)).lookup(text, 2) == [8, 5]  # falls back to the 1-gram (6,): latest earlier end 5
    assert NgramIndex((1,)).lookup([4, 9], 5) == []  # the suffix itself is not an earlier occurrence
    assert NgramIndex((2,)).lookup([7, 7, 7], 4) == [7]  # (7, 7) ended at 2: one token follows it


def brute_force(text: list[int], sizes, limit: int) -> list[int]:
    for n in sorted(sizes, reverse=True):
        ends = [e for e in range(n, len(text)) if text[e - n : e] == text[len(text) - n :]]
        if n <= len(text) and ends:
            return text[max(ends) : max(ends) + limit]
    return []


def test_incremental_index_equals_a_search_of_the_whole_text():
    """One index fed a growing text (as decoding feeds it) answers what a fresh scan of the text answers."""
    g = torch.Generator().manual_seed(0)
    text = torch.randint(0, 4, (80,), generator=g).tolist()
    index = NgramIndex((3, 2, 1))
    for length in range(1, len(text) + 1, 3):
        assert index.lookup(text[:length], 4) == brute_force(text[:length], (3, 2, 1), 4), length


# --------------------------------------------------------------------------- the graft


def test_graft_follows_matching_nodes_then_branches_as_the_last_rank():
    shape = TreeShape.from_widths([2, 1])  # root -> a(0) -> c(0); root -> b(1) -> d(0)
    buffer = ProposalBuffer(4, shape, [9, 1, 2, 3, 4], [0, 2, 2, 3, 3], [None, None], None, "heads", "V=10")
    merged = buffer.graft([2, 7, 8])  # follows node b (token 2), leaves after it as its second child
    assert merged.shape.rank_paths == ((), (0,), (1,), (0, 0), (1, 0), (1, 1), (1, 1, 0))
    assert merged.tokens == [9, 1, 2, 3, 4, 7, 8]
    assert merged.point_masses == frozenset({5, 6})
    assert merged.horizons == [0, 2, 2, 3, 3, NGRAM_HORIZON, NGRAM_HORIZON]
    assert buffer.graft([1, 3]) is buffer  # already a path of the tree
    alone = buffer.graft([5])  # no match: a third child of the root
    assert alone.tokens[alone.shape.rank_paths.index((2,))] == 5 and alone.point_masses == frozenset({alone.shape.rank_paths.index((2,))})


# --------------------------------------------------------------------------- exactness


def repeating_prompts():
    """Prompts that repeat themselves, so lookup finds matches (and, the model being small, often wrong ones)."""
    out = []
    for seed in range(2):
        base = torch.randint(0, 37, (8,), generator=torch.Generator().manual_seed(seed))
        out.append(torch.cat([base, base[:5]]))
    return out


CASES = {  # model head, generate options
    "ntp_alone": ("ntp", {"ngram": {"sizes": [2, 1], "max_draft": 5}}),
    "parallel_lookup_only": ("parallel", {"ngram": {"max_draft": 4, "with_heads": False}}),
    "parallel_chain_plus_lookup": ("parallel", {"ngram": {"max_draft": 4}}),
    "parallel_tree_plus_lookup": ("parallel", {"ngram": {"max_draft": 4}, "tree": [2, 2]}),
    "deepseek_plus_lookup": ("deepseek_d2", {"ngram": {"sizes": [3], "max_draft": 3}}),
}


@pytest.mark.parametrize("case,trunk", [
    pytest.param(case, trunk, marks=pytest.mark.slow if (case, trunk) == ("deepseek_plus_lookup", "hf") else ())  # ~12 s
    for case in sorted(CASES) for trunk in ("gpt", "hf")
])
def test_greedy_with_prompt_lookup_equals_plain_greedy(case, trunk):
    head, options = CASES[case]
    if trunk == "hf":
        from tests.test_hf_decode import hf_model

        model = fit_counting(hf_model(head if head != "ntp" else "none"))
    else:
        model = fit_counting(model64(head) if head != "ntp" else build_model("ntp").double().eval())
    proposed = 0
    for prompt in repeating_prompts():
        plain = generate(model, prompt, 20).tokens
        out = generate(model, prompt, 20, speculative=True, **options)
        assert out.tokens == plain
        proposed += out.stats["lookup_nodes"]
    assert proposed > 0


LAW_CASES = {  # tiny vocabulary-3 models of tests/test_decode_law.py
    "lookup_alone": ("parallel", {"ngram": {"sizes": [2, 1], "max_draft": 2, "with_heads": False}}),
    "chain_plus_lookup": ("parallel", {"ngram": {"sizes": [1], "max_draft": 2}, "draft_steps": 1}),
    "tree_plus_lookup": ("linear", {"ngram": {"sizes": [2, 1], "max_draft": 2}, "tree": [2]}),
    "deepseek_plus_lookup": ("deepseek_d1", {"ngram": {"sizes": [1], "max_draft": 2}}),
}
PROMPT = [2, 0, 1, 1]


@pytest.mark.parametrize("case", sorted(LAW_CASES))
def test_prompt_lookup_keeps_the_exact_sampling_law(case):
    law, runs, rejections, plain = law_case(*LAW_CASES[case], PROMPT)
    lookup_nodes = sum(run.stats["lookup_nodes"] for run in runs)
    lookup_accepted = sum(run.stats["lookup_accepted"] for run in runs)
    assert rejections > 0 and 0 < lookup_accepted < lookup_nodes  # lookup drafts were verified, some passed and some failed
    assert_same_law(law, plain)


def test_a_wrong_point_mass_residual_is_caught(monkeypatch):
    """The enumeration has teeth: after a rejected lookup draft, redrawing from p itself (y not removed) changes the law."""
    monkeypatch.setattr(acceptance, "without", lambda p, y: p)
    head, options = LAW_CASES["lookup_alone"]
    model = tiny(head)
    law, _, rejections = enumerated_law(lambda draws: generate(model, torch.tensor(PROMPT), 3, temperature=1.0, speculative=True,
                                                               draws=draws, **options))
    expected = exact_law(model, PROMPT, 3, 1.0, 3)
    assert rejections > 0 and max(abs(law.get(t, 0.0) - expected[t]) for t in expected) > 1e-3


# --------------------------------------------------------------------------- bad settings


@pytest.mark.parametrize("options,message", [
    ({"ngram": {"sizes": [0, 2]}}, r"^ngram\.sizes: must be a non-empty list of n-gram lengths ≥ 1"),
    ({"ngram": {"sizes": []}}, r"^ngram\.sizes: must be a non-empty list"),
    ({"ngram": {"max_draft": 0}}, r"^ngram\.max_draft: must be an int ≥ 1"),
    ({"ngram": {"window": 3}}, r"^ngram: has unknown fields \['window'\]"),
    ({"ngram": {}, "speculative": False}, r"^ngram: proposes drafts that the model verifies: it needs speculative=True"),
    ({"ngram": {"with_heads": False}, "tree": [2, 2]}, r"^tree: shapes the draft heads' candidates"),
    ({"ngram": {}, "tree": []}, r"^tree: must be a list of widths"),
])
def test_bad_prompt_lookup_settings_are_refused_in_one_line(options, message):
    assert_speculative_options_refused(options, message)


def assert_speculative_options_refused(options: dict, message: str) -> None:
    """Speculative `generate` on a K=3 parallel model with `options` stops with one line matching `message`."""
    with pytest.raises(ConfigError, match=message):
        generate(build_model("parallel", 3).double().eval(), torch.tensor([1, 2, 3]), 4, **{"speculative": True, **options})


def test_more_draft_tokens_than_the_context_allows_are_refused():
    from tests.test_hf_decode import hf_model

    model = hf_model("none")
    context = model.hf_model.config.max_position_embeddings
    with pytest.raises(ConfigError, match=rf"^ngram\.max_draft: must be < {context - 1}"):
        generate(model, torch.tensor([1, 2, 3]), 4, speculative=True, ngram=PromptLookup(max_draft=context))

"""Suffix drafts, one drafter per round and confidence-gated heads (lab/decode/suffix.py, lab/decode/choose.py):
the trie against a brute-force search, hand-worked loops and caps, greedy identity and the exact sampling law."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from lab.decode import generate
from lab.decode.ngram import NgramIndex, NgramProposer, PromptLookup, copy_on
from lab.decode.suffix import SuffixIndex, SuffixProposer
from lab.errors import ConfigError
from lab.decode_core.ledger import ledger
from lab.decode_core.tree import ProposalBuffer, TreeShape
from tests.helpers import build_model
from tests.test_decode_law import assert_same_law, enumerated_law, law_case, tiny
from tests.test_decode_ngram import assert_speculative_options_refused, repeating_prompts
from tests.test_speculative import exact_law, fit_counting, model64


class AtLength:
    length = 0  # a CachedModel's committed rows: what a proposal is stamped with


# --------------------------------------------------------------------------- the trie and the copies


def brute_match(text: list[int], max_depth: int) -> int:
    """The longest suffix (shorter than max_depth) that occurred earlier followed by a token."""
    n = len(text)
    for length in range(min(n, max_depth - 1), 0, -1):
        pattern = text[n - length :]
        if any(text[i : i + length] == pattern for i in range(n - length)):
            return length
    return 0


def brute_continuation(text: list[int], start: int, max_depth: int, limit: int, share: float) -> list[int]:
    """Greedy walk from the pattern text[start:]: the most frequent next token among its occurrences (ties: the latest)."""
    pattern, drafts = text[start:], []
    while len(drafts) < limit and len(pattern) < max_depth:
        nexts = Counter()
        latest = {}
        for i in range(len(text) - len(pattern)):
            if text[i : i + len(pattern)] == pattern:
                token = text[i + len(pattern)]
                nexts[token] += 1
                latest[token] = i
        if not nexts:
            break
        token = max(nexts, key=lambda t: (nexts[t], latest[t]))
        if nexts[token] < share * sum(nexts.values()):
            break
        drafts.append(token)
        pattern = pattern + [token]
    return drafts


@pytest.mark.parametrize("seed", range(6))
def test_the_incremental_trie_matches_and_continues_as_a_search_of_the_whole_text(seed):
    rng = random.Random(seed)
    text = [rng.randrange(4) for _ in range(rng.randrange(20, 80))]
    index, depth = SuffixIndex(max_depth=7), 7
    cut = 0
    while cut < len(text):  # tokens arrive in rounds of 1-5, as committed tokens do
        cut = min(len(text), cut + rng.randrange(1, 6))
        index.sync(text[:cut])
        length, node = index.match()
        assert length == brute_match(text[:cut], depth), (seed, cut)
        if node is not None:
            drafts, _ = index.continuation(node, length, 5, 0.3)
            assert drafts == brute_continuation(text[:cut], cut - length, depth, 5, 0.3), (seed, cut)


def test_a_repeat_drafts_through_its_period_only_with_loop():
    """Text 1 2 3 4 1 2 3 4 1 | frontier 2: the trie knows the period's continuation up to the text's end (3 4 1 2 ... 1 2);
    past it only a loop goes on."""
    text, frontier = [1, 2, 3, 4, 1, 2, 3, 4, 1], 2
    stops = SuffixProposer(AtLength(), PromptLookup(method="suffix", max_draft=12), "V").match(text, frontier, 12)
    loops = SuffixProposer(AtLength(), PromptLookup(method="suffix", max_draft=12, loop=True), "V").match(text, frontier, 12)
    assert stops == (6, [3, 4, 1, 2])  # "1 2 3 4 1 2" occurred at 0; its continuation runs into the text's end
    assert loops == (6, [3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
    assert copy_on([5, 6, 7], 1, 5, loop=True) == [6, 7, 6, 7, 6] and copy_on([5, 6, 7], 1, 5, loop=False) == [6, 7]


def test_ngram_occurrence_loop_and_spec_factor_by_hand():
    text = [7, 1, 8, 9, 1, 5, 6, 1]  # "1" occurred at 1 (then 8) and at 4 (then 5)
    latest = NgramProposer(AtLength(), PromptLookup(sizes=(1,), max_draft=4), "V")
    earliest = NgramProposer(AtLength(), PromptLookup(sizes=(1,), max_draft=4, occurrence="earliest"), "V")
    capped = NgramProposer(AtLength(), PromptLookup(sizes=(2, 1), max_draft=4, spec_factor=2.0), "V")
    assert latest.match(text[:-1], text[-1], 10) == (1, [5, 6, 1])  # stops at the text's end
    assert earliest.match(text[:-1], text[-1], 10) == (1, [8, 9, 1, 5])
    assert capped.match(text[:-1], text[-1], 10) == (1, [5, 6])  # ceil(2.0 × 1) drafts for a 1-token match
    looping = NgramProposer(AtLength(), PromptLookup(sizes=(1,), max_draft=4, loop=True), "V")
    assert looping.match(text[:-1], text[-1], 10) == (1, [5, 6, 1, 5])
    index = NgramIndex((1,), earliest=True)
    assert index.lookup([3, 4, 3, 4, 3], 2) == [4, 3]


def test_both_occurrences_draft_two_branches_of_one_tree_by_hand():
    """Text 7 1 8 9 1 5 6 | frontier 1: the latest "1" continues 5 6 1, the earliest 8 9 1 5 — one tree, the latest's chain
    as rank 0 and the earliest's as the root's second child; choose verifies the same tree; a graft adds both to the heads'."""
    text = [7, 1, 8, 9, 1, 5, 6, 1]
    both = NgramProposer(AtLength(), PromptLookup(sizes=(1,), max_draft=4, occurrence="both"), "V")
    assert both.match(text[:-1], text[-1], 10) == (1, [5, 6, 1])
    assert both.branches(text[:-1], text[-1], 10) == (1, [[5, 6, 1], [8, 9, 1, 5]])
    tree = both.propose(text[:-1], text[-1], 10, None)
    assert tree.shape.rank_paths == ((), (0,), (1,), (0, 0), (1, 0), (0, 0, 0), (1, 0, 0), (1, 0, 0, 0))
    assert tree.tokens == [1, 5, 8, 6, 9, 1, 1, 5] and tree.point_masses == frozenset(range(1, 8))
    assert tree.head_identity == "prompt lookup"
    short = NgramProposer(AtLength(), PromptLookup(sizes=(1,), max_draft=2, occurrence="both"), "V")
    assert short.propose([3, 4, 3, 4], 3, 10, None).tokens == [3, 4, 3]  # both copies are 4 3: one chain, no second branch
    longer = NgramProposer(AtLength(), PromptLookup(sizes=(1,), max_draft=4, occurrence="both"), "V")
    assert longer.propose([3, 4, 3, 4], 3, 10, None).tokens == [3, 4, 3, 4, 3]  # 4 3 (the text's end) inside 4 3 4 3: one chain


def test_pruning_keeps_a_rank_closed_subtree():
    """Widths [2, 2]: dropping node (0,) drops its children; dropping (1, 0) drops (1, 1) too (a rank needs the ones before)."""
    shape = TreeShape.from_widths([2, 2])  # nodes: (), (0,), (1,), (0,0), (0,1), (1,0), (1,1)
    buffer = ProposalBuffer(0, shape, [9, 1, 2, 3, 4, 5, 6], [0, 2, 2, 3, 3, 3, 3], [None, None], None, "h", "V")
    kept = buffer.pruned([1, 2, 3, 4, 6])  # (1, 0) missing
    assert kept.shape.rank_paths == ((), (0,), (1,), (0, 0), (0, 1)) and kept.tokens == [9, 1, 2, 3, 4]
    assert buffer.pruned([2, 5, 6]).shape.size == 1  # rank 1 without rank 0: nothing after the root
    assert buffer.pruned(range(7)) is buffer


# --------------------------------------------------------------------------- exactness

CASES = {  # model head, generate options
    "suffix_alone": ("ntp", {"ngram": {"method": "suffix", "max_draft": 5, "loop": True}}),
    "parallel_choose_suffix": ("parallel", {"ngram": {"method": "suffix", "max_draft": 6, "combine": "choose", "min_match": 2}}),
    "parallel_choose_ngram": ("parallel", {"ngram": {"max_draft": 6, "combine": "choose", "min_match": 1, "loop": True}}),
    "ntp_both_occurrences": ("ntp", {"ngram": {"sizes": [1], "max_draft": 4, "occurrence": "both"}}),
    "parallel_choose_both": ("parallel", {"ngram": {"sizes": [1], "max_draft": 4, "combine": "choose", "min_match": 1, "occurrence": "both"}}),
    "parallel_gated_chain": ("parallel", {"confidence": 0.2}),
    "parallel_gated_tree": ("parallel", {"confidence": 0.05, "tree": [2, 2]}),
    "deepseek_choose_gated": ("deepseek_d2", {"ngram": {"method": "suffix", "combine": "choose"}, "confidence": 0.1}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_greedy_with_each_new_drafter_equals_plain_greedy(case):
    head, options = CASES[case]
    model = fit_counting(model64(head) if head != "ntp" else build_model("ntp").double().eval())
    drafters = Counter()
    for prompt in repeating_prompts():
        plain = generate(model, prompt, 20).tokens
        out = generate(model, prompt, 20, speculative=True, **options)
        assert out.tokens == plain
        drafters.update(out.stats["drafter_by_round"])
    expected = {"suffix_alone": {"lookup"}, "ntp_both_occurrences": {"lookup"}, "parallel_gated_chain": {"heads"}, "parallel_gated_tree": {"heads"}}.get(case, {"lookup", "heads"})
    assert expected <= set(drafters), drafters  # every drafter of the case drafted some round


LAW_CASES = {  # tiny vocabulary-3 models of tests/test_decode_law.py
    "suffix_alone": ("parallel", {"ngram": {"method": "suffix", "max_draft": 2, "with_heads": False, "loop": True}}),
    "choose_suffix_or_heads": ("parallel", {"ngram": {"method": "suffix", "max_draft": 2, "combine": "choose", "min_match": 2}}),
    "both_occurrences": ("parallel", {"ngram": {"sizes": [1], "max_draft": 2, "with_heads": False, "occurrence": "both"}}),
    "graft_both_occurrences": ("linear", {"ngram": {"sizes": [1], "max_draft": 2, "occurrence": "both"}, "draft_steps": 1}),
    "gated_chain": ("parallel", {"confidence": 0.4}),
    "gated_tree": ("linear", {"confidence": 0.5, "tree": [2]}),  # a law over 3 tokens has a top probability ≥ 1/3
}
PROMPT = [2, 0, 1, 1]


@pytest.mark.parametrize("case", sorted(LAW_CASES))
def test_each_new_drafter_keeps_the_exact_sampling_law(case):
    law, runs, rejections, plain = law_case(*LAW_CASES[case], PROMPT)
    assert rejections > 0
    drafters = Counter(who for run in runs for who in run.stats["drafter_by_round"])
    total = lambda key: sum(run.stats[key] for run in runs)  # noqa: E731
    if case.startswith("gated"):  # the gate both kept and dropped drafts over the enumeration
        assert drafters["heads"] > 0 and drafters["none"] > 0, drafters
    else:  # the lookup drafted, and its drafts were both accepted and rejected: the law was tested where it acts
        assert 0 < total("lookup_accepted") < total("lookup_nodes"), (total("lookup_accepted"), total("lookup_nodes"))
    if "choose" in case:
        assert drafters["heads"] > 0 and drafters["lookup"] > 0, drafters  # each side won some rounds
    if "both_occurrences" in case:  # a second branch formed: a run verified more nodes than its rounds' depths add up to
        assert any(run.stats["tree_nodes"] > sum(run.stats["proposed_by_round"]) for run in runs)
    if case == "graft_both_occurrences":
        assert drafters["both"] > 0, drafters
    assert_same_law(law, plain)


def test_a_gate_on_the_drawn_tokens_own_probability_is_caught(monkeypatch):
    """The enumeration has teeth: gating on the probability of the token drawn (not the law it was drawn from) biases
    the output towards the target's own draws exactly where the head drew unlikely tokens."""
    import math

    import lab.decode.choose as choose

    monkeypatch.setattr(choose, "confidence_of", lambda buffer: [1.0] + [math.exp(s) for s in buffer.scores[1:]])
    head, options = LAW_CASES["gated_chain"]
    model = tiny(head)
    law, _, _ = enumerated_law(lambda draws: generate(model, torch.tensor(PROMPT), 3, temperature=1.0, speculative=True, draws=draws, **options))
    expected = exact_law(model, PROMPT, 3, 1.0, 3)
    assert max(abs(law.get(t, 0.0) - expected[t]) for t in expected) > 1e-4


def test_the_ledger_reports_each_drafters_rounds():
    model = fit_counting(model64("parallel"))
    prompt = repeating_prompts()[0]
    chosen = generate(model, prompt, 20, speculative=True, ngram={"max_draft": 6, "combine": "choose", "min_match": 1})
    grafted = generate(model, prompt, 20, speculative=True, ngram={"max_draft": 6})
    drafters = ledger(chosen.stats)["by_drafter"]
    names = chosen.stats["drafter_by_round"]
    assert sum(d["rounds"] for d in drafters.values()) == len(names) == chosen.stats["rounds"]
    lookup_rounds = [i for i, who in enumerate(names) if who == "lookup"]
    assert drafters["lookup"]["mean_accepted"] == pytest.approx(sum(chosen.stats["accepted_by_round"][i] for i in lookup_rounds) / len(lookup_rounds))
    assert "both" not in drafters and "both" in grafted.stats["drafter_by_round"]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("options,message", [
    ({"ngram": {"min_match": 0}}, r"^ngram\.min_match: must be an int ≥ 1"),
    ({"ngram": {"method": "suffix", "min_token_prob": 0}}, r"^ngram\.min_token_prob: must be a number in \(0, 1\)"),
    ({"ngram": {"method": "suffix", "min_token_prob": 1.0}}, r"^ngram\.min_token_prob: must be a number in \(0, 1\)"),
    ({"ngram": {"method": "trie"}}, r"^ngram\.method: unknown 'trie'; allowed: ngram, suffix"),
    ({"ngram": {"spec_factor": 0}}, r"^ngram\.spec_factor: must be a number > 0"),
    ({"ngram": {"combine": "choose", "with_heads": False}}, r"^ngram\.combine: choose picks the lookup or the draft heads"),
    ({"ngram": {"method": "suffix", "occurrence": "earliest"}}, r"^ngram\.occurrence: only method=ngram reads it"),
    ({"ngram": {"min_match": 3}}, r"^ngram\.min_match: only combine=choose reads it"),
    ({"confidence": 0.0}, r"^confidence: must be a probability in \(0, 1\)"),
    ({"confidence": 1.5}, r"^confidence: must be a probability in \(0, 1\)"),
    ({"confidence": 0.5, "ngram": {"with_heads": False}}, r"^confidence: gates the draft heads' proposals"),
    ({"confidence": 0.5, "speculative": False}, r"^confidence: gates the drafts that the model verifies"),
])
def test_bad_drafter_settings_are_refused_in_one_line(options, message):
    assert_speculative_options_refused(options, message)


def test_choosing_on_a_model_without_heads_is_refused():
    with pytest.raises(ConfigError, match=r"^ngram\.combine: choose picks the lookup or the draft heads"):
        generate(build_model("ntp").double().eval(), torch.tensor([1, 2, 3]), 4, speculative=True, ngram={"combine": "choose"})

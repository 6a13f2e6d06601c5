"""Acceptance conventions (docs/api.md): unconditional vs conditional per-position rates, mean
acceptance length with and without the bonus token, from hand-built per-round records."""

from __future__ import annotations

import pytest
import torch

from lab.decode import generate
from lab.decode.evaluation import evaluate_decoding
from lab.decode_core.ledger import RoundLedger, acceptance_conventions, ledger, ledger_line, merge, path_bounds
from tests.helpers import build_model

pytestmark = pytest.mark.usefixtures("single_thread")

# Six rounds (drafts offered m, drafts accepted a): (3,0) (3,1) (3,3) (3,2) (2,2) (1,0).
PROPOSED = [3, 3, 3, 3, 2, 1]
ACCEPTED = [0, 1, 3, 2, 2, 0]


def test_hand_built_rounds_give_both_per_position_vectors_and_both_means():
    got = acceptance_conventions(PROPOSED, ACCEPTED)
    # j=1: offered in all 6 rounds, a>=1 in 4 of them -> 4/6 either way (nothing precedes position 1).
    # j=2: offered in the first 5 (a = 0,1,3,2,2): a>=2 in 3 -> 3/5; of the 4 with a>=1 -> 3/4.
    # j=3: offered in the first 4 (a = 0,1,3,2): a>=3 in 1 -> 1/4; of the 2 with a>=2 -> 1/2.
    assert got["accept_by_position"] == pytest.approx([4 / 6, 3 / 5, 1 / 4])
    assert got["reach_by_position"] == pytest.approx([4 / 6, 3 / 6, 1 / 6])  # of all 6 verification rounds
    assert got["accept_cond_by_position"] == pytest.approx([4 / 6, 3 / 4, 1 / 2])
    assert got["mean_accepted"] == pytest.approx(8 / 6)  # (0+1+3+2+2+0)/6
    assert got["mean_accept_len"] == pytest.approx(1 + 8 / 6)  # with the bonus/correction token: vLLM's and Spec-Bench's tau


def test_no_drafts_is_plain_decoding_and_unreached_positions_are_nan():
    plain = acceptance_conventions([0, 0, 0], [0, 0, 0])
    assert plain == {"accept_by_position": [], "reach_by_position": [], "accept_cond_by_position": [], "mean_accepted": 0.0,
                     "mean_accept_len": 1.0}
    never = acceptance_conventions([1, 1], [0, 0], positions=2)  # position 2 never offered; position 1 never accepted
    assert never["accept_by_position"][0] == 0.0 and never["accept_cond_by_position"][0] == 0.0
    assert all(v != v for v in (never["accept_by_position"][1], never["accept_cond_by_position"][1]))


def test_prompt_lookup_rounds_of_varying_length_give_a_non_increasing_prefix_probability():
    """A 1-gram match drafts 1 token and misses; a long match drafts 5 and all pass (the shape prompt lookup makes)."""
    proposed, accepted = [1] * 6 + [0] * 3 + [5], [0] * 9 + [5]  # 3 rounds found no match (no drafts: plain steps)
    got = acceptance_conventions(proposed, accepted)
    assert got["accept_by_position"][:2] == pytest.approx([1 / 7, 1.0])  # the per-position rate rises: only the long match offers 2
    assert got["reach_by_position"] == pytest.approx([1 / 7] * 5)  # of the 7 rounds that drafted
    line = ledger_line({**stats_of(proposed, accepted, positions=5), "tree_nodes": 0})
    assert "P(prefix>=j): [0.14,0.14,0.14,0.14,0.14]" in line


def stats_of(proposed: list[int], accepted: list[int], positions: int = 3) -> dict:
    """Generation.stats as the decoder leaves them, for the given rounds (no EOS, no budget stop)."""
    return {
        "target_forwards": len(proposed) + 1, "rounds": len(proposed), "emitted": 1 + sum(a + 1 for a in accepted), "fallbacks": 0,
        "proposed_by_position": [sum(m >= j for m in proposed) for j in range(1, positions + 1)],
        "accepted_by_position": [sum(a >= j for a in accepted) for j in range(1, positions + 1)],
        "emitted_by_round": [a + 1 for a in accepted], "proposed_by_round": proposed, "accepted_by_round": accepted,
        "stopped_by_round": [False] * len(proposed), "prefill_time_s": 0.0, "draft_time_s": 0.0, "verify_time_s": 0.0,
        "total_time_s": 1.0, "kv_bytes": {"target": 1, "draft": 1, "branch_peak": 1},
        **acceptance_conventions(proposed, accepted, positions),
    }


def test_merge_and_ledger_recompute_the_conventions_from_all_rounds():
    first, second = stats_of(PROPOSED[:3], ACCEPTED[:3]), stats_of(PROPOSED[3:], ACCEPTED[3:])
    merged = merge([first, second])
    whole = acceptance_conventions(PROPOSED, ACCEPTED)
    for key, value in whole.items():
        assert merged[key] == pytest.approx(value), key  # not the sum of the two requests' rates
        assert ledger(merged)[key] == pytest.approx(value), key
    # the old count-based rate is the unconditional one
    assert ledger(merged)["accept_by_position"] == pytest.approx([a / p for a, p in zip(merged["accepted_by_position"], merged["proposed_by_position"])])


@pytest.mark.parametrize("name,k,extra", [("parallel", 4, {}), ("deepseek", 3, {"depth": 2})])
def test_generation_stats_carry_every_convention(name, k, extra):
    model = build_model(name, k, layers=3, **extra).double().eval()
    prompt = torch.tensor([3, 1, 4, 1, 5])
    spec = generate(model, prompt, 24, temperature=1.0, speculative=True, generator=torch.Generator().manual_seed(0)).stats
    expected = acceptance_conventions(spec["proposed_by_round"], spec["accepted_by_round"], k - 1)
    for key in ("accept_by_position", "accept_cond_by_position", "mean_accepted", "mean_accept_len"):
        assert spec[key] == pytest.approx(expected[key], nan_ok=True)
    assert spec["mean_accept_len"] == pytest.approx(1 + sum(spec["accepted_by_round"]) / spec["rounds"])
    # over the rounds that offer all k-1 positions, unconditional = product of the conditionals
    rounds = [(m, a) for m, a in zip(spec["proposed_by_round"], spec["accepted_by_round"]) if m == k - 1]
    full = acceptance_conventions([m for m, _ in rounds], [a for _, a in rounds])
    product = 1.0
    for j, conditional in enumerate(full["accept_cond_by_position"]):
        product *= conditional
        assert full["accept_by_position"][j] == pytest.approx(product)
    plain = generate(model, prompt, 8).stats
    assert plain["mean_accept_len"] == 1.0 and plain["mean_accepted"] == 0.0


def test_decoding_metrics_name_each_convention():
    model = build_model("parallel", 3, layers=3).double().eval()
    metrics = evaluate_decoding(model, [[1, 2, 3, 4], [5, 6, 7, 8]], 12)["metrics"]
    for key in ("decode/accept/p1", "decode/accept/p2", "decode/accept_cond/p1", "decode/accept_cond/p2", "decode/mean_accept_len", "decode/mean_accepted"):
        assert key in metrics, key
    assert metrics["decode/mean_accept_len"] == pytest.approx(1 + metrics["decode/mean_accepted"])


# Path acceptance and the Fréchet bounds (docs/decoding.md), 3 draft slots. Output token i is 10 + i.
OUT = list(range(10, 22))  # 12 tokens
ROUNDS = [  # (output index of the frontier, rank-0 drafts, accepted path length)
    (0, [11, 12, 99], 2),  # rank-0 right at slots 1, 2
    (3, [14, 98, 16], 1),  # right at slots 1, 3 (a chain stops after slot 1)
    (5, [16, 17, 18], 3),  # all right, full path
    (4, [15, 0, 17], 3),  # right at 1, 3; a tree's rank-1 candidate carried the path to full depth
    (9, [20, 77, 55], 1),  # slot 3 (index 12) lies past the output: not checked
    (6, [17, 18], 2),  # a shortened round (2 drafts): not checked
]


def settled(rounds, max_drafts: int = 3) -> dict:
    ledger = RoundLedger(max_drafts)
    for round_ in rounds:
        ledger.record_path(*round_)
    return ledger.stats(OUT)


def test_hand_built_rounds_give_path_acceptance_and_its_frechet_bounds():
    got = settled(ROUNDS)
    assert got["top1_checked_rounds"] == 4 and got["top1_match_by_position"] == [4, 2, 3]
    assert got["top1_all_match"] == 1 and got["path_full_accepted"] == 2
    assert got["top1_by_position"] == [1.0, 0.5, 0.75]
    assert got["top1_all"] == 0.25 and got["path_accept"] == 0.5  # the tree round reached full depth with a rank-0 miss
    assert got["frechet_lower"] == pytest.approx(0.25)  # max(0, 1 + 0.5 + 0.75 - 3 + 1)
    assert got["frechet_upper"] == 0.5  # min a_j
    assert got["frechet_lower"] <= got["top1_all"] <= got["frechet_upper"]
    assert "top1_all" not in settled([], max_drafts=0)  # a decoder that does not draft reports no paths


def test_the_ledger_counts_rounds_by_position_and_rate():
    """Three hand-built rounds: 3 drafts of which 2 pass, 1 of which 0 pass, 2 of which 2 pass (the request stops)."""
    ledger = RoundLedger(3, target_forwards=1)
    for proposed, accepted, emitted, stopped in ((3, 2, 3, False), (1, 0, 1, False), (2, 2, 2, True)):
        ledger.target_forwards += 1
        ledger.count_round(proposed, accepted, emitted, stopped)
    got = ledger.stats(list(range(7)))  # the prefill's token + 6
    assert (got["rounds"], got["target_forwards"], got["emitted"], got["tokens_per_forward"]) == (3, 4, 7, 7 / 4)
    assert got["proposed_by_position"] == [3, 2, 1] and got["accepted_by_position"] == [2, 2, 0]
    assert got["accept_by_position"] == [2 / 3, 1.0, 0.0] and got["reach_by_position"] == [2 / 3, 2 / 3, 0.0]
    assert got["mean_accepted"] == pytest.approx(4 / 3) and got["stopped_by_round"] == [False, False, True]


def test_frechet_bounds_of_the_seed_example():
    stats = {"top1_checked_rounds": 10, "top1_match_by_position": [9, 8, 7], "top1_all_match": 5, "path_full_accepted": 5}
    got = path_bounds(stats)
    assert got["top1_by_position"] == [0.9, 0.8, 0.7] and got["top1_all"] == 0.5 == got["path_accept"]
    assert got["frechet_lower"] == pytest.approx(0.4) and got["frechet_upper"] == pytest.approx(0.7)  # "anywhere from 0.4 to 0.7"
    assert all(v != v for k, v in path_bounds({}).items() if k != "top1_by_position")  # no checked round: NaN, not 0


def test_merge_and_ledger_recount_path_acceptance_from_every_request():
    first, second = settled(ROUNDS[:1]), settled(ROUNDS[1:])  # rates 0/1 and 2/3: their mean (1/3) is not the answer
    for stats, (proposed, accepted) in ((first, ([3], [2])), (second, ([3] * 5, [1, 3, 3, 1, 2]))):
        stats.update(stats_of(proposed, accepted), tree_nodes=0)
    merged = merge([first, second])
    for source in (merged, ledger(merged)):
        assert source["path_accept"] == 0.5 and source["top1_by_position"] == [1.0, 0.5, 0.75]
        assert source["frechet_lower"] == pytest.approx(0.25) and source["frechet_upper"] == 0.5 and source["top1_all"] == 0.25
    assert "path accept: 0.50" in ledger_line(merged) and "all: 0.25 in [0.25, 0.50] (Fréchet)" in ledger_line(merged)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_chain_accepts_its_full_path_exactly_when_every_rank0_draft_is_right(temperature):
    """A rejected draft is never the emitted token (greedy: the argmax differs; sampling: the residual has no mass
    there), so for a chain path acceptance equals the all-right rate, inside its bounds; decode/* carries both."""
    model = build_model("parallel", 4, layers=3).double().eval()
    checked = 0
    for seed in range(3):
        prompt = torch.randint(0, 13, (5,), generator=torch.Generator().manual_seed(seed))
        spec = generate(model, prompt, 30, temperature=temperature, speculative=True, generator=torch.Generator().manual_seed(seed)).stats
        checked += spec["top1_checked_rounds"]
        assert spec["path_full_accepted"] == spec["top1_all_match"]
        if spec["top1_checked_rounds"]:
            assert spec["frechet_lower"] <= spec["top1_all"] <= spec["frechet_upper"]
    assert checked > 0
    metrics = evaluate_decoding(model, [[1, 2, 3, 4], [5, 6, 7, 8]], 12)["metrics"]
    for key in ("decode/path_accept", "decode/top1_all", "decode/frechet_lower", "decode/frechet_upper", "decode/top1/p1", "decode/top1/p3"):
        assert key in metrics, key

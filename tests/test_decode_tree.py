"""Draft trees and batched draft stacks (lab/decode_core/tree.py, acceptance.accept_tree, cache.commit_rows, heads' decode_drafter)."""

from __future__ import annotations

import json

import pytest
import torch

from lab.decode import generate
from lab.decode.generate import Decoder
from lab.errors import ConfigError
from lab.decode_core.sampling import TokenChooser
from lab.decode_core.target import CachedModel
from lab.decode_core.tree import TreeShape, tree_shape
from lab.model.heads import head_config
from lab.model.mtp import MTPModel
from tests.head_cases import case, split, without
from tests.helpers import committed_kv, make_batch, model_config
from tests.test_speculative import fit_counting

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread

HEADS = {  # every head whose horizons draft independently (ntp drafts nothing, deepseek chains its drafts)
    **without("ntp", "deepseek", k=4),
    "linear_replicated": case("linear", 4, unembedding="replicated"),
    "parallel_2_layers": case("parallel", 4, n_layers=2),
}
TREES = [[2, 2, 2], [4, 3, 2], [3, 1, 1], [[0, 0, 0], [0, 1], [1, 0, 0], [1, 0, 1], [2]]]
TIMES = ("prefill_time_s", "draft_time_s", "verify_time_s", "total_time_s", "tokens_per_s", "time_split_s")


def model64(head: str, seed: int = 0):
    name, k, extra = split(HEADS[head])
    torch.manual_seed(seed)
    return MTPModel(model_config(2, d_model=16), head_config({"name": name, "k": k, "compute_match": "none", **extra})).double().eval()


@pytest.fixture(scope="module")
def fitted():
    cache = {}

    def get(head):
        if head not in cache:
            cache[head] = fit_counting(model64(head))
        return cache[head]

    return get


def prompts():
    return [torch.randint(0, 37, (length,), generator=torch.Generator().manual_seed(seed)) for seed, length in ((0, 1), (1, 6), (2, 11))]


# --------------------------------------------------------------------------- topology


def test_widths_give_the_cartesian_tree_of_the_seed():
    shape = TreeShape.from_widths([4, 3, 2])
    assert shape.size - 1 == 40 and sum(not kids for kids in shape.children) == 24  # 40 nodes, 24 paths
    assert shape.widths == (4, 3, 2) and shape.depth == 3 and not shape.is_chain
    assert TreeShape.from_widths([1, 1, 1]) == TreeShape.chain(3) and TreeShape.chain(3).is_chain


def test_ancestor_mask_and_positions_of_a_small_tree():
    shape = tree_shape([[0, 0], [0, 1], [1]])  # root; (0) (1); (0,0) (0,1)
    assert shape.parents == (-1, 0, 0, 1, 1) and shape.depths == (0, 1, 1, 2, 2) and shape.ranks == (0, 0, 1, 0, 1)
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(shape.ancestor_mask(), expected)
    assert shape.limited(1) == tree_shape([2]) and shape.limited(2, [1, 2]) == tree_shape([[0, 0], [0, 1]])


@pytest.mark.parametrize("spec,message", [
    ([[1]], "ranks [1]"), ([[0, 1]], "ranks [1]"), ([2, 0], "≥ 1"), ("4,3", "list of widths"), ([], "list of widths"), ([[0], "a"], "list of widths"),
])
def test_bad_trees_are_refused_in_one_line(spec, message):
    with pytest.raises(ConfigError, match="tree") as error:
        tree_shape(spec)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_trees_that_do_not_fit_the_model_are_refused():
    parallel, prompt = model64("parallel"), torch.tensor([1, 2])
    for kwargs, message in (({"tree": [2], "speculative": False}, "speculative=True"), ({"tree": [2, 2, 2, 2], "speculative": True}, "at most 3"),
                            ({"tree": [40], "speculative": True}, "vocabulary has 37")):
        with pytest.raises(ConfigError, match=message):
            generate(parallel, prompt, 4, **kwargs)
    torch.manual_seed(0)
    deepseek = MTPModel(model_config(2), head_config({"name": "deepseek", "depth": 2, "compute_match": "none"})).eval()
    # the heads named are the registry's whose drafter drafts trees (medusa among them), deepseek not
    with pytest.raises(ConfigError, match=r"need independent heads \(linear, parallel, causal, anticausal, identity, medusa\); use tree=None"):
        generate(deepseek, prompt, 4, speculative=True, tree=[2, 2])


# --------------------------------------------------------------------------- exactness


@pytest.mark.parametrize("head", sorted(HEADS))
def test_tree_greedy_equals_plain_greedy(head, fitted):
    model = fitted(head)
    beyond = 0
    for prompt in prompts():
        plain = generate(model, prompt, 40).tokens
        for tree in TREES:
            out = generate(model, prompt, 40, speculative=True, tree=tree)
            assert out.tokens == plain, (head, tree)
            beyond += out.stats["accepted_beyond_top1"]
            assert out.stats["target_forwards"] == out.stats["rounds"] + 1
    if head != "identity":  # identity drafts the next-token logits at every slot: rank 1 rarely wins
        assert beyond > 0  # some round accepted a candidate the chain would not have proposed


def comparable(stats: dict) -> str:
    """The stats without wall-clock times, as text: a position no round reached is NaN in both, and NaN != NaN."""
    return json.dumps({k: v for k, v in stats.items() if k not in TIMES}, sort_keys=True)


@pytest.mark.parametrize("head", sorted(HEADS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_of_width_one_is_chain_decoding(head, temperature, fitted):
    model = fitted(head)
    for seed, prompt in enumerate(prompts()):
        runs = [generate(model, prompt, 30, temperature=temperature, speculative=True, tree=tree, generator=torch.Generator().manual_seed(seed))
                for tree in (None, [1, 1, 1], [[0, 0, 0]])]
        chain, *trees = runs
        for tree in trees:
            assert tree.tokens == chain.tokens
            assert comparable(tree.stats) == comparable(chain.stats)


class CheckedTreeDecoder(Decoder):
    """After every round: no provisional row left, every cache holds exactly the committed tokens,
    and the drafts come from the committed state (they equal a full forward's horizon logits)."""

    def round(self, tokens, frontier, out, remaining):
        following = super().round(tokens, frontier, out, remaining)
        self.checks += 1
        for key, cache in self.state.caches.caches.items():
            assert cache.provisional == 0 and cache.committed == len(tokens), key
        full = self.state.model(make_batch([tokens + [following]], [[0] * (len(tokens) + 1)]))  # horizon k rows [1, S-k, d]
        last = len(tokens) - 1  # the proposer drafts from the last committed row
        for k in range(2, self.state.model.k + 1):
            if last < full[k - 1].hidden.shape[1]:
                expected = self.state.model.horizon_logits(k, full[k - 1].hidden[0, last])  # [V]
                # float64 but for the rotary cos/sin, float32 and elementwise: the same bits on both paths (test_decode_cache's ATOL)
                torch.testing.assert_close(self.proposer.next_logits[k - 2], expected, atol=1e-10, rtol=0)
        return following


@pytest.mark.parametrize("head", ["linear", "linear_replicated", "parallel", "parallel_2_layers", "causal", "anticausal"])
def test_committed_caches_after_tree_rounds_equal_a_plain_decode(head, fitted):
    model = fitted(head)
    prompt = [3, 5, 7, 11, 2, 9]
    with torch.no_grad():
        for seed in range(1, 9):  # the first seed whose run accepts a candidate of rank ≥ 1 (a sibling path)
            decoder = CheckedTreeDecoder(model, TokenChooser(1.0, None, torch.Generator().manual_seed(seed)), True, None, None, tree_shape([3, 2, 2]))
            decoder.checks = 0
            out = decoder.run(prompt, 30)  # every round of every seed is checked
            s = out.stats
            if s["accepted_beyond_top1"] > 0:
                break
        assert decoder.checks > 0 and s["accepted_beyond_top1"] > 0
        assert sum(p - a for p, a in zip(s["proposed_by_position"], s["accepted_by_position"])) > 0  # some siblings were discarded
        committed = (prompt + out.tokens)[: decoder.state.length]
        plain = CachedModel(model)  # prefill, then one token per forward: every target stack's cache
        plain.forward(prompt)
        plain.commit(family=None)
        for token in committed[len(prompt) :]:
            plain.forward([token])
            plain.commit(family=None)
        worst = 0.0
        for key, cache in plain.caches.caches.items():
            mine = decoder.state.caches.caches[key]
            assert mine.committed == cache.committed == len(committed)
            for (k1, v1), (k2, v2) in zip(committed_kv(mine), committed_kv(cache)):
                worst = max(worst, (k1 - k2).abs().max().item(), (v1 - v2).abs().max().item())
        # Not bitwise, and it cannot be while one pass verifies many rows: under torch's CPU kernels a row's
        # result depends on the batch shape it is computed in, not only on its own inputs (float64, one thread:
        # F.linear over 8 rows vs row by row differs by up to 3.6e-15 at d=16 and 2.5e-14 at d=128 — gemm vs
        # gemv blocking; SDPA of 5 masked queries vs each query alone over its own keys by up to 3.3e-16 — the
        # key-block reduction). A plain decode computes every row alone, so only a one-row-per-forward decode
        # (no verification pass) could match it bitwise. What holds exactly is tested below: the committed rows
        # are the verification pass's path rows moved bitwise, and they do not depend on any sibling bitwise.
        # (The one float32 piece, the rotary cos/sin, is elementwise from integer positions: the same bits on both paths.)
        assert worst < 1e-13  # measured ≤ 2e-15


def test_commit_rows_moves_the_path_rows_exactly():
    """Bitwise: after a tree pass, committing path [0, 2, 5] leaves exactly those provisional rows after the prefix."""
    model = model64("parallel")
    state = CachedModel(model)
    with torch.no_grad():
        state.forward([4, 5, 6])
        state.commit(family=None)
        shape = tree_shape([2, 2])  # nodes: root, (0) (1), (0,0) (0,1) (1,0) (1,1)
        state.forward([7, 8, 9, 10, 11, 12, 13], shape)
        before = [[(k[:, :, 3:].clone(), v[:, :, 3:].clone()) for k, v in zip(c.keys, c.values)] for c in state.caches.caches.values()]
        state.commit_rows([0, 2, 5], family=None)
        for cache, rows in zip(state.caches.caches.values(), before):
            assert cache.committed == 6 and cache.provisional == 0
            for (k, v), (k0, v0) in zip(committed_kv(cache), rows):
                assert torch.equal(k[:, :, 3:], k0[:, :, [0, 2, 5]]) and torch.equal(v[:, :, 3:], v0[:, :, [0, 2, 5]])


def committed_state(model, shape, prompt: list[int], nodes: list[int], path: list[int]):
    """Every cache's committed K/V and the next drafts after prefill and one tree pass whose path `path` is committed."""
    decoder = Decoder(model, TokenChooser(0.0, None, None), True, None, None, shape)
    with torch.no_grad():
        for tokens, rows, tree in ((prompt, list(range(len(prompt))), None), (nodes, path, shape)):
            result, _ = decoder.target_pass(tokens, tree)
            decoder.after_pass(result, rows)  # the decoder's commit: draft stacks, then every target stack
    kv = {key: [(k.clone(), v.clone()) for k, v in committed_kv(cache)] for key, cache in decoder.state.caches.caches.items()}
    return kv, decoder.proposer.next_logits.clone()


@pytest.mark.parametrize("head", sorted(HEADS))
def test_committed_rows_do_not_depend_on_sibling_tokens_bitwise(head):
    """The tightest exact property of a tree commit: rewrite every node off the accepted path and the committed
    caches of every stack (trunk, next-token and draft stacks) and the next round's drafts stay bitwise equal.
    A node that saw a sibling through the mask, a sibling row kept, or a row moved to the wrong slot breaks it."""
    model, shape = model64(head), tree_shape([3, 2, 2])
    path, node = [], shape.size - 1  # the last leaf (ranks 2, 1, 1) and its ancestors
    while node > 0:
        path.insert(0, node)
        node = shape.parents[node]
    path = [0, *path]
    prompt = [3, 5, 7, 11, 2, 9]
    nodes = torch.randint(0, 37, (shape.size,), generator=torch.Generator().manual_seed(0)).tolist()
    others = torch.randint(0, 37, (shape.size,), generator=torch.Generator().manual_seed(1)).tolist()
    rewritten = [nodes[i] if i in path else others[i] for i in range(shape.size)]
    assert sum(a != b for a, b in zip(nodes, rewritten)) > shape.size // 2
    kv, drafts = committed_state(model, shape, prompt, nodes, path)
    kv2, drafts2 = committed_state(model, shape, prompt, rewritten, path)
    assert kv.keys() == kv2.keys() and ("trunk",) in kv  # plus every block stack the head owns (linear and identity: none)
    for key in kv:  # bitwise on any CPU: both runs pass the same tree shape, so the same kernels run on the same shapes
        for (k1, v1), (k2, v2) in zip(kv[key], kv2[key]):
            assert k1.shape[2] == len(prompt) + len(path) and torch.equal(k1, k2) and torch.equal(v1, v2), key
    assert torch.equal(drafts, drafts2)
    # the check can fail: a node *on* the path rewritten changes the committed rows
    changed = list(nodes)
    changed[path[1]] = (nodes[path[1]] + 1) % 37
    assert not torch.equal(committed_state(model, shape, prompt, changed, path)[0][("trunk",)][0][0], kv[("trunk",)][0][0])


@pytest.mark.parametrize("head", ["linear", "linear_replicated", "parallel", "parallel_2_layers", "identity"])
def test_batched_drafts_equal_the_heads_own_rows(head):
    """One batched draft forward (stacked weights, one cache with a head axis) = each head's own stack, horizon by horizon."""
    model = model64(head)
    state = CachedModel(model)
    decoder = Decoder(model, TokenChooser(0.0, None, None), True, None, None)
    tokens = [1, 4, 9, 16, 25, 36, 12]
    with torch.no_grad():
        decoder.state = state
        decoder.proposer.state = state
        for chunk in (tokens[:4], tokens[4:6], tokens[6:]):
            result = state.forward(chunk)
            decoder.proposer.after_verify(result, list(range(len(chunk))))
            state.commit(len(chunk))
        seen = tokens[: state.length]
        full = model(make_batch([seen + [0, 0, 0, 0]], [[0] * (len(seen) + 4)]))  # rows past the end only pad horizons
        for k in range(2, model.k + 1):
            expected = model.horizon_logits(k, full[k - 1].hidden[0, len(seen) - 1])  # [V]
            # float64 but for the rotary cos/sin, float32 and elementwise: the same bits on both paths
            torch.testing.assert_close(decoder.proposer.next_logits[k - 2], expected, atol=1e-10, rtol=0)


# --------------------------------------------------------------------------- path statistics


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_measured_path_agreement_lies_inside_its_frechet_bounds(temperature, fitted):
    model = fitted("parallel")
    for seed, prompt in enumerate(prompts()):
        out = generate(model, prompt, 40, temperature=temperature, speculative=True, tree=[2, 2, 2], generator=torch.Generator().manual_seed(seed))
        s = out.stats
        assert s["top1_checked_rounds"] > 0
        assert s["frechet_lower"] - 1e-12 <= s["top1_all"] <= s["frechet_upper"] + 1e-12
        assert s["path_accept"] >= s["top1_all"]  # a tree accepts the full rank-0 path whenever it is right, and more
        # Counted by hand from the output: position 1's rank-0 draft agrees with the emitted token at least as often as all three do.
        assert out.stats["top1_match_by_position"][0] >= out.stats["top1_all_match"]


def test_tree_for_budget_adds_the_most_likely_nodes_first():
    from lab.decode_core.tree import tree_for_budget

    # a = [0.5, 0.5]: node values (0,) .5, (1,) .25, (0,0) .25, (2,) .125, (0,1) .125, (1,0) .125 …
    shape = tree_for_budget([0.5, 0.5], 3)
    assert sorted(shape.rank_paths[1:]) == [(0,), (0, 0), (1,)]
    assert tree_for_budget([0.9, 0.9, 0.9], 3) == TreeShape.chain(3)  # confident heads: a chain
    assert tree_for_budget([0.1, 0.1], 3) == tree_shape([3])  # unsure heads: a wide first level
    wide = tree_for_budget([0.6, 0.4, 0.3], 20)
    assert wide.size - 1 == 20 and TreeShape.from_paths(wide.rank_paths[1:]) == wide  # rank-closed (from_paths checks)

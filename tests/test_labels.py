"""The label compiler (docs/tensor-conventions.md) against hand-written masks.

Every expected mask below was written out by hand from the rules:
endpoint rule  horizon_mask[t] = active[t] & active[t+k] & seg[t] == seg[t+k];
interval rule  chain state[t] = tokens t..t+depth active and in seg[t];
               chain loss[t]  = state[t] & active[t+depth+1] & seg[t+depth+1] == seg[t].
"""

import pytest
import torch

from lab.errors import ConfigError
from lab.labels import chain_masks, horizon_mask
from tests.helpers import PAD, make_batch


def bools(rows):
    return torch.tensor(rows, dtype=torch.bool)


# The worked example of docs/tensor-conventions.md.
ORACLE = make_batch(
    [[11, 12, 13, 14, 15, PAD, PAD], [21, 22, 23, 31, 32, 33, 34]],
    [[0, 0, 0, 0, 0, -1, -1], [0, 0, 0, 1, 1, 1, 1]],
)
ORACLE_MASKS = {
    # row 0: pairs into the padding are dropped; row 1: pairs across the 23|31 boundary are dropped.
    1: [[1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 1]],  # 4 + 5 = 9
    2: [[1, 1, 1, 0, 0], [1, 0, 0, 1, 1]],  # 3 + 3 = 6
    3: [[1, 1, 0, 0], [0, 0, 0, 1]],  # 2 + 1 = 3
}


@pytest.mark.parametrize("k,count", [(1, 9), (2, 6), (3, 3)])
def test_design_oracle_counts_and_masks(k, count):
    mask = horizon_mask(ORACLE["active"], ORACLE["segment_ids"], k)
    assert mask.dtype == torch.bool and mask.shape == (2, 7 - k)
    assert torch.equal(mask, bools(ORACLE_MASKS[k]))
    assert int(mask.sum()) == count
    assert mask.numel() == (12, 10, 8)[k - 1]  # what a shape-only slice would have counted


def test_horizon_mask_pairs_are_same_document_tokens():
    """Each valid (t, t+k) pair names two tokens of one document: 1x→1y or 2x→2y, 3x→3y."""
    tokens = ORACLE["tokens"]
    for k in (1, 2, 3):
        mask = horizon_mask(ORACLE["active"], ORACLE["segment_ids"], k)
        source, target = tokens[:, :-k][mask], tokens[:, k:][mask]  # [N_k] each
        assert torch.equal(source // 10, target // 10)
        assert torch.equal(target - source, torch.full_like(source, k))


def one_doc(active=None, segments=None, n=8):
    segments = [0] * n if segments is None else segments
    return torch.tensor([segments]), (torch.tensor([segments]) >= 0) if active is None else bools([active])


def test_chain_masks_one_document():
    """[A B C D E F]: depth 1 loss rows (A,B→C) (B,C→D) (C,D→E) (D,E→F); depth 2 (A,C→D) (B,D→E) (C,E→F)."""
    segments, active = one_doc(n=6)
    state, loss = chain_masks(active, segments, 1)
    assert torch.equal(state, bools([[1, 1, 1, 1, 1]]))  # t = 0..4: (t, t+1) exist
    assert torch.equal(loss, bools([[1, 1, 1, 1]]))  # t = 0..3: label t+2 exists
    state, loss = chain_masks(active, segments, 2)
    assert torch.equal(state, bools([[1, 1, 1, 1]]))
    assert torch.equal(loss, bools([[1, 1, 1]]))
    # Alignment: loss row t at depth d has base t, teacher t+d, label t+d+1.
    letters = torch.arange(6)[None]  # A=0 .. F=5
    for depth, expected in ((1, [(0, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 5)]), (2, [(0, 2, 3), (1, 3, 4), (2, 4, 5)])):
        _, loss = chain_masks(active, segments, depth)
        n = loss.shape[1]
        rows = zip(letters[0, :n][loss[0]], letters[0, depth : depth + n][loss[0]], letters[0, depth + 1 :][loss[0]])
        assert [tuple(int(x) for x in r) for r in rows] == expected


def test_chain_masks_hole_breaks_every_window_covering_it():
    # one document of 8 tokens, token 3 is a hole (active False, still segment 0)
    segments, active = one_doc(active=[1, 1, 1, 0, 1, 1, 1, 1])
    state, loss = chain_masks(active, segments, 1)
    assert torch.equal(state, bools([[1, 1, 0, 0, 1, 1, 1]]))  # windows {2,3} and {3,4} cover the hole
    assert torch.equal(loss, bools([[1, 0, 0, 0, 1, 1]]))  # t=1 has label 3 = the hole
    state, loss = chain_masks(active, segments, 2)
    assert torch.equal(state, bools([[1, 0, 0, 0, 1, 1]]))  # windows 1..3, 2..4, 3..5 cover it
    assert torch.equal(loss, bools([[0, 0, 0, 0, 1]]))  # t=0's label is token 3
    # The endpoint rule only looks at t and t+2: (2, 4) stays valid although 3 is a hole.
    assert torch.equal(horizon_mask(active, segments, 2), bools([[1, 0, 1, 0, 1, 1]]))


def test_chain_masks_segment_boundary_breaks_the_chain():
    segments, active = one_doc(segments=[0, 0, 0, 0, 1, 1, 1, 1])
    state, loss = chain_masks(active, segments, 1)
    assert torch.equal(state, bools([[1, 1, 1, 0, 1, 1, 1]]))
    assert torch.equal(loss, bools([[1, 1, 0, 0, 1, 1]]))
    state, loss = chain_masks(active, segments, 2)
    assert torch.equal(state, bools([[1, 1, 0, 0, 1, 1]]))
    assert torch.equal(loss, bools([[1, 0, 0, 0, 1]]))


def test_chain_masks_padding_and_the_design_oracle():
    state, loss = chain_masks(ORACLE["active"], ORACLE["segment_ids"], 1)
    assert torch.equal(state, bools([[1, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 1]]))
    assert torch.equal(loss, bools([[1, 1, 1, 0, 0], [1, 0, 0, 1, 1]]))
    state, loss = chain_masks(ORACLE["active"], ORACLE["segment_ids"], 2)
    assert torch.equal(state, bools([[1, 1, 1, 0, 0], [1, 0, 0, 1, 1]]))
    assert torch.equal(loss, bools([[1, 1, 0, 0], [0, 0, 0, 1]]))


def test_chain_loss_equals_endpoint_rule_without_holes():
    """Without holes the interval and endpoint rules agree: chain loss at depth d == horizon_mask at d+1."""
    torch.manual_seed(0)
    segments = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, -1, -1]])
    active = segments >= 0
    for depth in (1, 2, 3):
        _, loss = chain_masks(active, segments, depth)
        assert torch.equal(loss, horizon_mask(active, segments, depth + 1))


@pytest.mark.parametrize("fn,arg_name", [(horizon_mask, "k"), (chain_masks, "depth")])
@pytest.mark.parametrize("value", [0, -1, 7, 8])
def test_out_of_range_horizon_raises_naming_the_argument(fn, arg_name, value):
    with pytest.raises(ConfigError) as error:
        fn(ORACLE["active"], ORACLE["segment_ids"], value)
    assert error.value.field == arg_name


@pytest.mark.parametrize("fn", [horizon_mask, chain_masks])
def test_shape_and_dtype_mismatch_raise(fn):
    with pytest.raises(ConfigError, match="labels"):
        fn(ORACLE["active"][:, :6], ORACLE["segment_ids"], 1)
    with pytest.raises(ConfigError, match="labels"):
        fn(ORACLE["active"][0], ORACLE["segment_ids"][0], 1)
    with pytest.raises(ConfigError, match="bool"):
        fn(ORACLE["active"].long(), ORACLE["segment_ids"], 1)


def test_target_mask_removes_targets_but_keeps_sources_and_chain_state():
    """[A B C D E F] with only D, E allowed as labels: (t, t+k) survives when t+k ∈ {3, 4}; sources may be any token."""
    segments, active = one_doc(n=6)
    target = bools([[0, 0, 0, 1, 1, 0]])
    assert torch.equal(horizon_mask(active, segments, 1, target), bools([[0, 0, 1, 1, 0]]))
    assert torch.equal(horizon_mask(active, segments, 3, target), bools([[1, 1, 0]]))
    state, loss = chain_masks(active, segments, 1, target)
    assert torch.equal(state, chain_masks(active, segments, 1)[0])  # every row still has its input
    assert torch.equal(loss, bools([[0, 1, 1, 0]]))  # labels t+2 ∈ {3, 4}
    with pytest.raises(ConfigError, match=r"^labels: target_mask must be a bool"):
        horizon_mask(active, segments, 1, target.long())

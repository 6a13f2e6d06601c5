"""Zero-parameter (identity) heads and leap offsets (issue 17 items 1 and 3).

Oracles: identity at K = 1 is ntp to the bit (same seed, same parameters); identity at any K adds
no parameter; offsets compile labels by the endpoint rule at the offset on a hand batch with
packing, a hole and padding (one offset leaves its horizon empty); bad offsets are refused.
"""

import pytest
import torch

from lab.config.checks import check_horizons_fit
from lab.errors import ConfigError
from lab.model.heads import head_config
from lab.model.mtp import parameter_table
from tests.helpers import build_model, loss_and_grads, make_batch, packed_batch

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread


@pytest.mark.parametrize("tie", [True, False])
def test_identity_k1_equals_ntp_exactly(tie):
    ntp, identity = build_model("ntp", 1, tie=tie), build_model("identity", 1, tie=tie)
    assert identity.state_dict().keys() == ntp.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(ntp.state_dict().values(), identity.state_dict().values()))
    batch = packed_batch()
    loss_ntp, g_ntp = loss_and_grads(ntp, batch)
    loss, g = loss_and_grads(identity, batch)
    assert torch.equal(loss, loss_ntp)  # bitwise on any CPU: the same ops on the same shapes (the identity head adds none at K=1)
    assert all(torch.equal(g_ntp[name], g[name]) for name in g_ntp)


def test_identity_heads_add_no_parameters_and_project_the_trunk_state():
    model = build_model("identity", 4)
    assert parameter_table(model)["params_total"] == parameter_table(build_model("ntp", 1))["params_total"]
    assert parameter_table(model)["params_head_private"] == 0
    batch = packed_batch()
    horizons = model(batch)
    for k, horizon in enumerate(horizons, start=1):
        S = batch["tokens"].shape[1]
        assert horizon.hidden.shape[1] == S - k
        torch.testing.assert_close(horizon.hidden, horizons[0].hidden[:, : S - k])  # the same trunk rows, cut at S-k
        assert horizon.weight is model.trunk.unembedding


def test_identity_refuses_replicated_unembeddings():
    with pytest.raises(ConfigError, match=r"^head\.unembedding: identity heads add no parameters"):
        head_config({"name": "identity", "k": 2, "unembedding": "replicated"})


# ------------------------------------------------------------------- leap offsets

# S = 8. Row 0: doc A (5 tokens, a masked hole at t=3) + doc B (3 tokens). Row 1: one doc (4 tokens) + 4 pads.
TOKENS = [[11, 12, 13, 14, 15, 21, 22, 23], [31, 32, 33, 34, 0, 0, 0, 0]]
SEGMENTS = [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, -1, -1, -1, -1]]
ACTIVE = [[1, 1, 1, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0, 0]]
# Endpoint rule at offset o: t and t+o both active and in one document (a hole in between does not matter).
EXPECTED_MASKS = {
    1: [[1, 1, 0, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0, 0]],  # 4 + 3 = 7
    3: [[0, 1, 0, 0, 0], [1, 0, 0, 0, 0]],  # row 0: 1→4 spans the hole; 0→3 ends on it. row 1: 0→3
    5: [[0, 0, 0], [0, 0, 0]],  # no document has two real tokens 5 apart: an empty horizon
}


def leap_batch():
    return make_batch(TOKENS, SEGMENTS, torch.tensor(ACTIVE, dtype=torch.bool))


@pytest.mark.parametrize("head", ["identity", "parallel", "linear", "causal"])
def test_offsets_compile_labels_by_the_endpoint_rule(head):
    model = build_model(head, 3, offsets=[1, 3, 5])
    horizons = model(leap_batch())
    assert [h.k for h in horizons] == [1, 2, 3] and [h.offset for h in horizons] == [1, 3, 5]
    for horizon in horizons:
        o = horizon.offset
        assert horizon.mask.tolist() == [[bool(v) for v in row] for row in EXPECTED_MASKS[o]], f"offset {o}"
        assert horizon.labels.tolist() == [row[o:] for row in TOKENS]  # tokens[t + o]
        assert horizon.hidden.shape[:2] == (2, 8 - o)
    assert [int(h.mask.sum()) for h in horizons] == [7, 2, 0]


def test_empty_leap_horizon_trains_the_rest():
    model = build_model("parallel", 3, offsets=[1, 3, 5])
    loss, g = loss_and_grads(model, leap_batch())
    assert torch.isfinite(loss)
    assert g["head.stacks.1.blocks.0.mlp.up.weight"].abs().max() > 0
    assert all(g[n].abs().max() == 0 for n in g if n.startswith("head.stacks.2."))  # offset 5 has no valid row


def test_default_offsets_are_one_to_k_and_the_manifest_fields_follow():
    model = build_model("parallel", 4)
    assert model.head.offsets == (1, 2, 3, 4) and model.head.can_draft
    leap = build_model("parallel", 4, offsets=[1, 3, 5, 7])
    assert leap.head.offsets == (1, 3, 5, 7) and not leap.head.can_draft


@pytest.mark.parametrize("offsets, message", [
    ([1, 2], "must have K = 3 entries"),
    ([2, 3, 4], "must start at 1"),
    ([1, 3, 3], "must be strictly increasing"),
    ([1, 4, 2], "must be strictly increasing"),
    ([1, 2.5, 3], "must be a list of integers"),
])
def test_bad_offsets_are_one_line_naming_the_field(offsets, message):
    with pytest.raises(ConfigError, match=rf"^head\.offsets: {message}") as error:
        head_config({"name": "parallel", "k": 3, "offsets": offsets})
    assert "\n" not in str(error.value)


def test_offsets_must_fit_the_sequence():
    check_horizons_fit(3, 8, [1, 3, 7])
    with pytest.raises(ConfigError, match=r"^head\.offsets: every offset must be < data\.seq_len=8"):
        check_horizons_fit(3, 8, [1, 3, 8])


def test_deepseek_refuses_non_contiguous_offsets():
    head_config({"name": "deepseek", "depth": 2, "offsets": [1, 2, 3]})  # contiguous: the chain's own
    with pytest.raises(ConfigError, match=r"^head\.offsets: deepseek's chain predicts consecutive tokens"):
        head_config({"name": "deepseek", "depth": 2, "offsets": [1, 3, 5]})

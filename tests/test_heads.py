"""Heads: equivalences, gradient ownership, packing isolation, compute matching, aliasing."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lab.errors import ConfigError
from lab.labels import chain_masks, horizon_mask
from lab.model.heads import head_class, head_config
from lab.model.mtp import MTPModel, alias_groups, parameter_table
from lab.nn.blocks import Block
from tests.head_cases import case, cases
from tests.helpers import PAD, VOCAB, assert_close_rel, build_model, horizon_sums, loss_and_grads, make_batch, model_config, packed_batch

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread

# Every registered head at K = 3 (DeepSeek depth 2) and variants, with the default compute matching where the depth allows it.
CASES = {
    **cases(),
    "linear_replicated": case("linear", unembedding="replicated"),
    "anticausal": case("anticausal", layers=4),
    "deepseek_shared": case("deepseek", share_depth_weights=True),
    "medusa": case("medusa", n_layers=2),
    "medusa_replicated": case("medusa", unembedding="replicated"),
}
# The transformers trunk (a tiny Llama of the same width, vocabulary and depth: tests/helpers.py) runs the
# packing, hole and causality tests too.
TRUNKS = ["gpt", "hf"]
MTP_CASES = [c for c in CASES if c != "ntp"]


def case_model(case, **overrides):
    return build_model(**{**CASES[case], **overrides})


def is_trunk_block(name):
    return name.startswith("trunk.blocks.")


def is_head_private(name):
    return name.startswith("head.")


def assert_same_grads(g_ref, g, names, rtol=1e-6):
    for n in names:
        assert_close_rel(g_ref[n], g[n], rtol, n)


# ---------------------------------------------------------------- 1. equivalences


@pytest.mark.parametrize("trunk_grad", ["joint", "detached"])
def test_k1_parallel_causal_anticausal_agree(trunk_grad):
    batch = packed_batch()
    ref = build_model("parallel", 1, trunk_grad=trunk_grad)
    loss_ref, g_ref = loss_and_grads(ref, batch)
    assert all(g_ref[n].abs().max() > 0 for n in g_ref if is_head_private(n) and "weight" in n)
    for name in ("causal", "anticausal"):
        model = build_model(name, 1, seed=1, trunk_grad=trunk_grad)
        assert set(model.state_dict()) == set(ref.state_dict())
        model.load_state_dict(ref.state_dict())
        loss, g = loss_and_grads(model, batch)
        torch.testing.assert_close(loss, loss_ref, rtol=1e-6, atol=0)
        assert set(g) == set(g_ref)
        assert_same_grads(g_ref, g, g_ref)


@pytest.mark.parametrize("name", ["parallel", "causal", "anticausal"])
@pytest.mark.parametrize("head_layers", [1, 2])
def test_compute_matched_k1_head_reproduces_ntp(name, head_layers):
    """Trunk (n - L blocks) + head (L blocks) with the ntp model's last L blocks == the ntp model."""
    n_layers = 3
    ntp = build_model("ntp", 1, layers=n_layers)
    model = build_model(name, 1, seed=1, layers=n_layers, n_layers=head_layers)
    trunk_layers = n_layers - head_layers
    assert len(model.trunk.blocks) == trunk_layers

    def ntp_name(n):
        if n.startswith("head.stacks.0.blocks."):
            j, rest = n[len("head.stacks.0.blocks.") :].split(".", 1)
            return f"trunk.blocks.{trunk_layers + int(j)}.{rest}"
        return n

    ntp_state = ntp.state_dict()
    mapping = {n: ntp_name(n) for n in model.state_dict()}
    assert sorted(mapping.values()) == sorted(ntp_state)  # a bijection onto the ntp parameters
    model.load_state_dict({n: ntp_state[m] for n, m in mapping.items()})
    loss_ntp, g_ntp = loss_and_grads(ntp, batch := packed_batch())
    loss, g = loss_and_grads(model, batch)
    torch.testing.assert_close(loss, loss_ntp, rtol=1e-6, atol=0)
    for n, m in mapping.items():
        assert_close_rel(g_ntp[m], g[n], 1e-6, n)


@pytest.mark.parametrize("tie", [True, False])
def test_linear_k1_identity_map_equals_ntp(tie):
    ntp = build_model("ntp", 1, tie=tie)
    model = build_model("linear", 1, seed=1, tie=tie)
    model.load_state_dict({**ntp.state_dict(), "head.maps.0.weight": torch.eye(16)})
    batch = packed_batch()
    loss_ntp, g_ntp = loss_and_grads(ntp, batch)
    loss, g = loss_and_grads(model, batch)
    torch.testing.assert_close(loss, loss_ntp, rtol=1e-6, atol=0)
    assert_same_grads(g_ntp, g, g_ntp)
    assert g["head.maps.0.weight"].abs().max() > 0


@pytest.mark.parametrize("tie", [True, False])
def test_linear_k1_replicated_copy_equals_ntp(tie):
    ntp = build_model("ntp", 1, tie=tie)
    model = build_model("linear", 1, seed=1, tie=tie, unembedding="replicated")
    # construction copies the trunk's unembedding into the replicated projection (a distinct Parameter)
    assert torch.equal(model.head.projections[0], model.trunk.unembedding)
    assert model.head.projections[0] is not model.trunk.unembedding
    model.load_state_dict({**ntp.state_dict(), "head.projections.0": ntp.trunk.unembedding.detach().clone()})
    batch = packed_batch()
    loss_ntp, g_ntp = loss_and_grads(ntp, batch)
    loss, g = loss_and_grads(model, batch)
    torch.testing.assert_close(loss, loss_ntp, rtol=1e-6, atol=0)
    unembed = "trunk.embed.weight" if tie else "trunk.unembed"
    assert_same_grads(g_ntp, g, [n for n in g_ntp if n != unembed])
    if tie:  # ntp's tied matrix collects embedding + unembedding gradients; here they are split
        assert_close_rel(g_ntp[unembed], g[unembed] + g["head.projections.0"], 1e-6, unembed)
    else:
        assert_close_rel(g_ntp[unembed], g["head.projections.0"], 1e-6, unembed)
        assert model.trunk.unembed.grad is None


def test_deepseek_shared_depth_weights_at_depth_1_equals_per_depth():
    per_depth = build_model("deepseek", 2, depth=1)
    shared = build_model("deepseek", 2, seed=1, depth=1, share_depth_weights=True)
    shared.load_state_dict(per_depth.state_dict())
    batch = packed_batch()
    loss_ref, g_ref = loss_and_grads(per_depth, batch)
    loss, g = loss_and_grads(shared, batch)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-6, atol=0)
    assert set(g) == set(g_ref)
    assert_same_grads(g_ref, g, g_ref)


def test_deepseek_shared_module_is_reused_recurrently():
    """D=2 with one shared module == per-depth modules holding equal weights; its grad is their sum."""
    shared = build_model("deepseek", 3, depth=2, share_depth_weights=True)
    per_depth = build_model("deepseek", 3, seed=1, depth=2)
    state = shared.state_dict()
    for n, v in list(state.items()):
        if n.startswith("head.depth_modules.0."):
            state[n.replace("depth_modules.0.", "depth_modules.1.")] = v
    per_depth.load_state_dict(state)
    batch = packed_batch()
    loss_ref, g_ref = loss_and_grads(per_depth, batch)
    loss, g = loss_and_grads(shared, batch)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-6, atol=0)
    for n in g:
        if n.startswith("head.depth_modules.0."):
            assert_close_rel(g_ref[n] + g_ref[n.replace("depth_modules.0.", "depth_modules.1.")], g[n], 1e-5, n)
        else:
            assert_close_rel(g_ref[n], g[n], 1e-5, n)


@pytest.mark.parametrize("depth", [1, 2])
def test_deepseek_depth_d_consumes_teacher_token_t_plus_d(depth):
    """Changing token j changes depth-d row j-d (through its teacher) but no earlier row."""
    model = build_model("deepseek", depth + 1, depth=depth)
    batch = make_batch(torch.randint(1, VOCAB, (1, 10), generator=torch.Generator().manual_seed(3)), [[0] * 10])
    j = 6
    changed = batch["tokens"].clone()
    changed[0, j] = changed[0, j] % (VOCAB - 1) + 1
    with torch.no_grad():
        before = model(batch)[depth].hidden  # [1, S-d-1, d]
        after = model({**batch, "tokens": changed})[depth].hidden
    torch.testing.assert_close(after[:, : j - depth], before[:, : j - depth], atol=1e-6, rtol=0)
    assert (after[0, j - depth] - before[0, j - depth]).abs().max() > 1e-4
    horizon = model(batch)[depth]
    assert horizon.k == depth + 1 and torch.equal(horizon.labels, batch["tokens"][:, depth + 1 :])


def test_deepseek_normed_chain_feeds_depth_2_the_final_normed_depth_1_output():
    """head.chain_state=normed (transformers' and vLLM's MTP loop): depth 2 reads final_norm(depth-1 output);
    block_output (the paper's h^1) reads it raw. Same weights, a non-trivial final norm: the two differ."""
    normed = build_model("deepseek", 3, depth=2, hidden_input="post_norm", chain_state="normed")
    raw = build_model("deepseek", 3, seed=1, depth=2, hidden_input="post_norm")
    with torch.no_grad():
        normed.trunk.final_norm.weight.uniform_(0.5, 1.5)
    raw.load_state_dict(normed.state_dict())
    batch = make_batch(torch.randint(1, VOCAB, (1, 10), generator=torch.Generator().manual_seed(4)), [[0] * 10])
    head, shared, seq_len = normed.head, normed.shared_parts(), 10
    with torch.no_grad():
        depth1 = normed(batch)[1].hidden  # [1, S-2, d]: depth 1's block output, rows with a label
        state_mask = lambda d: chain_masks(batch["active"], batch["segment_ids"], d)[0]  # noqa: E731
        ctx = lambda d: head._depth_context(batch, state_mask(d), d)  # noqa: E731
        trunk_state = shared.final_norm(normed.trunk(batch["tokens"], normed.trunk.attention_context(batch["segment_ids"], batch["position_ids"], batch["active"])))
        out1 = head.module_at(1)(trunk_state[:, : seq_len - 1], shared.embed(batch["tokens"][:, 1:]), ctx(1))  # [1, S-1, d]
        expected = head.module_at(2)(shared.final_norm(out1)[:, : seq_len - 2], shared.embed(batch["tokens"][:, 2:]), ctx(2))  # [1, S-2, d]
        torch.testing.assert_close(depth1, out1[:, : seq_len - 2], atol=1e-6, rtol=0)
        torch.testing.assert_close(normed(batch)[2].hidden, expected[:, : seq_len - 3], atol=1e-6, rtol=0)
        assert (raw(batch)[2].hidden - normed(batch)[2].hidden).abs().max() > 1e-3


# ---------------------------------------------------------------- 2. gradient ownership


@pytest.mark.parametrize("case", [c for c in MTP_CASES if list(case_model(c).head.parameters())])  # a head with parameters of its own
def test_detached_trunk_gets_no_gradient_from_extra_horizons(case):
    batch = packed_batch()
    joint = case_model(case, tie=False)
    detached = case_model(case, seed=1, tie=False, trunk_grad="detached")
    detached.load_state_dict(joint.state_dict())
    K = joint.k

    _, g_extra = loss_and_grads(detached, batch, [0.0] + [1.0] * (K - 1))
    assert all(g_extra[n].abs().max() == 0 for n in g_extra if is_trunk_block(n))  # None or exactly zero
    assert any(g_extra[n].abs().max() > 0 for n in g_extra if is_head_private(n))
    reaches = "head.projections.1" if "replicated" in case else "trunk.unembed"
    assert g_extra[reaches].abs().max() > 0 and g_extra["trunk.final_norm.weight"].abs().max() > 0
    # control: under joint the same loss does reach the trunk blocks
    _, g_joint_extra = loss_and_grads(joint, batch, [0.0] + [1.0] * (K - 1))
    assert all(g_joint_extra[n].abs().max() > 0 for n in g_joint_extra if is_trunk_block(n) and n.endswith("qkv.weight"))

    # Full loss: detached trunk blocks see exactly the horizon-1 gradient; head and shared output
    # parameters see the same gradient as under joint (detach only cuts the path into the trunk).
    weights = [1.0, 0.5, 0.25][:K]
    _, g_det = loss_and_grads(detached, batch, weights)
    _, g_h1 = loss_and_grads(joint, batch, [1.0] + [0.0] * (K - 1))
    _, g_all = loss_and_grads(joint, batch, weights)
    assert_same_grads(g_h1, g_det, [n for n in g_det if is_trunk_block(n)])
    assert_same_grads(g_all, g_det, [n for n in g_det if is_head_private(n) or n in ("trunk.unembed", "trunk.final_norm.weight")])


def entries(model, batch):
    """A few trunk parameter entries for finite differences: (name, index)."""
    last = len(model.trunk.blocks) - 1
    return [
        ("trunk.blocks.0.attn.qkv.weight", (1, 2)),
        ("trunk.blocks.0.mlp.down.weight", (3, 5)),
        (f"trunk.blocks.{last}.attn_norm.weight", (4,)),
        (f"trunk.blocks.{last}.mlp.up.weight", (7, 1)),
        ("trunk.embed.weight", (int(batch["tokens"][0, 2]), 3)),
    ]


@pytest.mark.parametrize("case", MTP_CASES)
def test_joint_trunk_gradient_is_the_sum_of_horizon_gradients(case):
    model = case_model(case).double()
    batch = packed_batch()
    K = model.k
    weights = [1.0, 0.5, 0.25][:K]
    _, g_total = loss_and_grads(model, batch, weights)
    per_horizon = [loss_and_grads(model, batch, [w if j == k else 0.0 for j in range(K)])[1] for k, w in enumerate(weights)]
    for n in g_total:
        if is_trunk_block(n):
            assert_close_rel(g_total[n], sum(g[n] for g in per_horizon), 1e-10, n)  # float64; one batch, the same forward each time
            if n.endswith("qkv.weight"):  # every horizon really contributes to the trunk
                assert all(g[n].abs().max() > 0 for g in per_horizon)

    def loss_at():
        with torch.no_grad():
            return sum(w * s for w, s in zip(weights, horizon_sums(model(batch)))).item()

    eps = 1e-6
    for name, index in entries(model, batch):
        param = model.get_parameter(name)
        with torch.no_grad():
            original = param[index].item()
            param[index] = original + eps
            up = loss_at()
            param[index] = original - eps
            down = loss_at()
            param[index] = original
        fd = (up - down) / (2 * eps)
        analytic = g_total[name][index].item()
        assert abs(fd - analytic) <= 1e-6 * max(1.0, abs(analytic)), (name, index, fd, analytic)


@pytest.mark.parametrize("trunk_grad", ["joint", "detached"])
def test_deepseek_depth_modules_own_their_gradients(trunk_grad):
    model = build_model("deepseek", 3, depth=2, trunk_grad=trunk_grad)
    batch = packed_batch()

    def module_grads(weights):
        _, g = loss_and_grads(model, batch, weights)
        return [max(g[n].abs().max().item() for n in g if n.startswith(f"head.depth_modules.{i}.")) for i in (0, 1)]

    assert module_grads([1.0, 0.0, 0.0]) == [0.0, 0.0]  # horizon 1 (the trunk's own) touches no module
    d1, d2 = module_grads([0.0, 1.0, 0.0])  # horizon 2 = depth 1
    assert d1 > 0 and d2 == 0.0
    d1, d2 = module_grads([0.0, 0.0, 1.0])  # horizon 3 = depth 2 runs on depth 1's state
    assert d1 > 0 and d2 > 0


# ---------------------------------------------------------------- 3. packing isolation


@pytest.mark.parametrize("trunk", TRUNKS)
@pytest.mark.parametrize("trunk_grad", ["joint", "detached"])
@pytest.mark.parametrize("case", list(CASES))
def test_perturbing_document_a_leaves_document_b_logits(case, trunk_grad, trunk):
    """Row 0 = A(5) B(6) pad; row 1 = B(6) A(5) pad. Perturb every token of A in both rows."""
    g = torch.Generator().manual_seed(7)
    a, b = torch.randint(1, VOCAB, (5,), generator=g), torch.randint(1, VOCAB, (6,), generator=g)
    pad = torch.tensor([PAD])
    segs = [[0] * 5 + [1] * 6 + [-1], [0] * 6 + [1] * 5 + [-1]]
    a2 = a % (VOCAB - 1) + 1
    batch = make_batch(torch.stack([torch.cat([a, b, pad]), torch.cat([b, a, pad])]), segs)
    changed = make_batch(torch.stack([torch.cat([a2, b, pad]), torch.cat([b, a2, pad])]), segs)
    model = case_model(case, trunk_grad=trunk_grad, trunk=trunk)
    with torch.no_grad():
        before, after = model(batch), model(changed)
    for h0, h1 in zip(before, after):
        l0, l1 = F.linear(h0.norm(h0.hidden), h0.weight), F.linear(h1.norm(h1.hidden), h1.weight)  # [B, S-k, V]
        n_rows = l0.shape[1]
        # row 0: every B source row that exists at this horizon
        torch.testing.assert_close(l1[0, 5:n_rows], l0[0, 5:n_rows], atol=1e-6, rtol=0)
        # row 1: B's supervised rows (DeepSeek rows whose teacher window leaves B are unsupervised)
        rows = h0.mask[1].clone()
        rows[6:] = False
        assert rows.any()
        torch.testing.assert_close(l1[1][rows], l0[1][rows], atol=1e-6, rtol=0)
        # control: A's own supervised rows do change
        assert (l1[0, :4] - l0[0, :4])[h0.mask[0, :4]].abs().max() > 1e-4


@pytest.mark.parametrize("trunk", TRUNKS)
@pytest.mark.parametrize("case", list(CASES))
def test_a_hole_token_never_reaches_a_supervised_row(case, trunk):
    """Token 4 is a hole (active False inside the document): its id must not change any supervised logit."""
    tokens = torch.randint(1, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    active = torch.ones(1, 12, dtype=torch.bool)
    active[0, 4] = False
    batch = {**make_batch(tokens, [[0] * 12]), "active": active}
    changed = tokens.clone()
    changed[0, 4] = tokens[0, 4] % (VOCAB - 1) + 1
    model = case_model(case, trunk=trunk)
    with torch.no_grad():
        before, after = model(batch), model({**batch, "tokens": changed})
    for h0, h1 in zip(before, after):
        assert h0.mask.any()
        l0, l1 = F.linear(h0.norm(h0.hidden), h0.weight), F.linear(h1.norm(h1.hidden), h1.weight)  # [1, S-k, V]
        torch.testing.assert_close(l1[h0.mask], l0[h0.mask], atol=1e-6, rtol=0)


@pytest.mark.parametrize("trunk", TRUNKS)
@pytest.mark.parametrize("case", list(CASES))
def test_horizon_rows_labels_masks_and_no_future_leak(case, trunk):
    """Horizon k: labels tokens[t+k], the label compiler's mask, and row t sees tokens ≤ t (+ DeepSeek teachers ≤ t+k-1)."""
    batch = packed_batch()
    batch["active"][0, 2] = False  # a hole: the endpoint and interval rules now differ
    model = case_model(case, trunk=trunk)
    horizons = model(batch)
    assert [h.k for h in horizons] == list(range(1, model.k + 1))
    for h in horizons:
        S = batch["tokens"].shape[1]
        assert h.hidden.shape == (2, S - h.k, 16) and h.labels.shape == h.mask.shape == (2, S - h.k)
        assert torch.equal(h.labels, batch["tokens"][:, h.k :])
        if CASES[case]["name"] == "deepseek" and h.k > 1:
            expected = chain_masks(batch["active"], batch["segment_ids"], h.k - 1)[1]
        else:
            expected = horizon_mask(batch["active"], batch["segment_ids"], h.k)
        assert torch.equal(h.mask, expected)
    j = 5  # change token j of row 1 (one 8-token document)
    changed = batch["tokens"].clone()
    changed[1, j] = changed[1, j] % (VOCAB - 1) + 1
    with torch.no_grad():
        after = model({**batch, "tokens": changed})
    for h0, h1 in zip(horizons, after):
        sees = j - (h0.k - 1 if CASES[case]["name"] == "deepseek" else 0)  # first row that may see token j
        torch.testing.assert_close(h1.hidden[1, :sees], h0.hidden[1, :sees].detach(), atol=1e-6, rtol=0)
        assert (h1.hidden[1, sees] - h0.hidden[1, sees]).abs().max() > 1e-4


@pytest.mark.parametrize(
    "head", [dict(name="parallel", k=3), dict(name="causal", k=3, n_layers=2), dict(name="anticausal", k=2)]
)
def test_head_init_options(head):
    random = build_model(layers=4, **head)
    stacks = random.head.head_stacks()
    assert not torch.equal(stacks[0].blocks[0].attn.qkv.weight, stacks[1].blocks[0].attn.qkv.weight)
    last = build_model(layers=4, init="copy_last", **head)
    reference = last.trunk.blocks[-1].state_dict()
    trunk_parameters = {id(p) for p in last.trunk.parameters()}
    for stack in last.head.head_stacks():
        for block in stack.blocks:
            assert all(torch.equal(v, reference[n]) for n, v in block.state_dict().items())
            assert not any(id(p) in trunk_parameters for p in block.parameters())  # copies, not aliases
    older_name = build_model(layers=4, init="copy_last_block", **head)  # the option's earlier name still reads
    assert older_name.head_cfg.init == "copy_last"
    assert all(torch.equal(a, b) for a, b in zip(older_name.head.state_dict().values(), last.head.state_dict().values()))
    first = build_model(layers=4, init="copy_first_head", **head)
    stacks = first.head.head_stacks()
    for stack in stacks[1:]:
        assert all(torch.equal(v, stacks[0].state_dict()[n]) for n, v in stack.state_dict().items())
        assert all(p is not q for p, q in zip(stack.parameters(), stacks[0].parameters()))  # copies, not aliases


# ---------------------------------------------------------------- 4. compute matching and validation


def blocks_reached(model, weights) -> list:
    """Transformer Block modules whose parameters get a non-zero gradient from Σ_k w_k S_k."""
    loss_and_grads(model, packed_batch(), weights)
    return [m for m in model.modules() if isinstance(m, Block) and any(p.grad is not None and p.grad.abs().max() > 0 for p in m.parameters())]


# Per head: compute_match=blocks over 8 layers (trunk blocks, head blocks, Block modules the whole objective reaches),
# and compute_match=next_token_path over 4 (trunk layers, head blocks on the next-token path, head blocks in all).
BLOCK_COUNTS = [
    (dict(name="ntp", k=1), (8, 0, 8), (4, 0, 0)),
    (dict(name="linear", k=3), (8, 0, 8), (4, 0, 0)),
    (dict(name="parallel", k=3), (5, 3, 8), (3, 1, 3)),
    (dict(name="parallel", k=2, n_layers=2), (4, 4, 8), (2, 2, 4)),
    (dict(name="causal", k=3), (5, 3, 8), (3, 1, 3)),
    (dict(name="anticausal", k=3), (5, 3, 8), (1, 3, 3)),
    (dict(name="anticausal", k=2, n_layers=1), None, (2, 2, 2)),
    (dict(name="deepseek", k=3, depth=2), (6, 2, 8), (4, 0, 2)),
    (dict(name="deepseek", k=3, depth=2, share_depth_weights=True), (6, 2, 7), (4, 0, 2)),  # one block run at both depths
]


@pytest.mark.parametrize("head,trunk,head_blocks,block_modules", [(head, *blocks) for head, blocks, _ in BLOCK_COUNTS if blocks])
def test_compute_match_blocks_keeps_the_ntp_block_count(head, trunk, head_blocks, block_modules):
    """The paper's matching: trunk blocks + every head block (DeepSeek depths too) = model.n_layers."""
    model = build_model(layers=8, compute_match="blocks", **head)
    table = parameter_table(model)
    assert (table["blocks_trunk"], table["blocks_head"], table["blocks_total"]) == (trunk, head_blocks, 8)
    assert len(model.trunk.blocks) == trunk
    assert len(blocks_reached(model, [1.0] * model.k)) == block_modules  # measured: the whole objective reaches them


@pytest.mark.parametrize("head,trunk_layers,path_blocks,total_blocks", [(head, *path) for head, _, path in BLOCK_COUNTS])
def test_compute_match_next_token_path_has_model_depth(head, trunk_layers, path_blocks, total_blocks):
    model = build_model(layers=4, compute_match="next_token_path", **head)
    table = parameter_table(model)
    assert (table["blocks_trunk"], table["blocks_next_token_path"] - table["blocks_trunk"], table["blocks_head"]) == (
        trunk_layers,
        path_blocks,
        total_blocks,
    )
    assert table["blocks_next_token_path"] == 4
    # measured: the horizon-1 loss reaches exactly model.n_layers transformer blocks
    assert len(blocks_reached(model, [1.0] + [0.0] * (model.k - 1))) == 4
    # without compute matching the trunk keeps every layer
    unmatched = build_model(layers=4, compute_match="none", **head)
    assert parameter_table(unmatched)["blocks_trunk"] == 4


def test_parallel_k4_over_8_layers_acceptance_numbers():
    """The issue's acceptance: 4 trunk + 4 head blocks (blocks), 7 + 4 (next_token_path), ntp 8."""
    blocks = parameter_table(build_model("parallel", 4, layers=8, compute_match="blocks"))
    path = parameter_table(build_model("parallel", 4, layers=8, compute_match="next_token_path"))
    ntp = parameter_table(build_model("ntp", 1, layers=8, compute_match="blocks"))
    assert (blocks["blocks_trunk"], blocks["blocks_head"]) == (4, 4)
    assert (path["blocks_trunk"], path["blocks_head"]) == (7, 4)
    assert (ntp["blocks_trunk"], ntp["blocks_head"]) == (8, 0)
    assert blocks["params_total"] == ntp["params_total"]  # shared unembedding: the same parameters


@pytest.mark.parametrize(
    "head,match",
    [(dict(name="anticausal", k=4), "next_token_path"), (dict(name="parallel", k=2, n_layers=4), "next_token_path"),
     (dict(name="causal", k=2, n_layers=5), "next_token_path"), (dict(name="parallel", k=4), "blocks"),
     (dict(name="deepseek", k=5, depth=4), "blocks")],
)
def test_compute_match_without_a_trunk_layer_raises(head, match):
    with pytest.raises(ConfigError) as error:
        build_model(layers=4, compute_match=match, **head)
    assert error.value.field == "head.compute_match"
    assert "model.n_layers=4" in error.value.message and "head.k=" in error.value.message
    build_model(layers=4, compute_match="none", **head)  # fine when not matched


@pytest.mark.parametrize(
    "head,field",
    [
        (dict(name="deepseek", k=2, depth=2), "head.k"),
        (dict(name="deepseek", k=4, depth=2), "head.k"),
        (dict(name="deepseek", k=1), "head.depth"),
        (dict(name="deepseek", k=3, depth=2, unembedding="replicated"), "head.unembedding"),
        (dict(name="deepseek", k=3, depth=2, fusion_order="xx"), "head.fusion_order"),
        (dict(name="parallel", k=0), "head.k"),
        (dict(name="linear", k=-1), "head.k"),
        (dict(name="ntp", k=2), "head.k"),
        (dict(name="nope", k=1), "head.name"),
        (dict(name="parallel", k=2, init="zeros"), "head.init"),
        (dict(name="parallel", k=2, trunk_grad="frozn"), "head.trunk_grad"),
        (dict(name="parallel", k=2, compute_match="layers"), "head.compute_match"),
    ],
)
def test_bad_head_config_raises_naming_the_field(head, field):
    with pytest.raises(ConfigError) as error:
        build_model(layers=4, **head)
    assert error.value.field == field


def test_unknown_head_class_lists_the_allowed_names():
    with pytest.raises(ConfigError, match="nope.*allowed: ntp, linear, parallel, causal, anticausal, deepseek") as error:
        head_class("nope")
    assert error.value.field == "head.name"


def test_deepseek_k_follows_from_depth_when_k_is_unset():
    model = MTPModel(model_config(), head_config({"name": "deepseek", "k": None, "depth": 3, "compute_match": "none"}))
    assert model.k == 4 and len(model(packed_batch())) == 4


# ---------------------------------------------------------------- 5. alias contract


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_alias_contract(case, tie):
    model = case_model(case, tie=tie)
    params = list(model.parameters())
    assert len({id(p) for p in params}) == len(params)
    assert alias_groups(model) == []
    assert len(list(model.named_parameters(remove_duplicate=False))) == len(params)
    assert (model.trunk.unembedding is model.trunk.embed.weight) == tie
    table = parameter_table(model)
    assert table["params_total"] == sum(p.numel() for p in params)
    assert table["params_trunk"] + table["params_head_private"] + table["params_shared"] == table["params_total"]
    assert not any(isinstance(m, nn.Embedding) for m in model.head.modules())  # no copied embedding
    for horizon in model(packed_batch()):
        assert horizon.norm is model.trunk.final_norm
        if case == "medusa_replicated":  # Medusa: horizon 1 is the trunk's own lm_head, horizons ≥ 2 own a copy
            assert horizon.weight is (model.trunk.unembedding if horizon.k == 1 else model.head.projections[horizon.k - 2])
        elif "replicated" in case:
            assert horizon.weight is model.head.projections[horizon.k - 1]
        else:
            assert horizon.weight is model.trunk.unembedding


@pytest.mark.parametrize("depth", [1, 2])
def test_deepseek_teacher_embedding_is_the_trunks(depth):
    """Untied, detached trunk: horizon-2 loss reaches trunk.embed.weight only through the teacher tokens."""
    model = build_model("deepseek", depth + 1, depth=depth, tie=False, trunk_grad="detached")
    batch = packed_batch()
    loss_and_grads(model, batch, [0.0, 1.0] + [0.0] * (depth - 1))
    grad = model.trunk.embed.weight.grad
    assert grad is not None and grad.abs().max() > 0
    touched = set(torch.nonzero(grad.abs().sum(-1)).flatten().tolist())
    teacher = set(batch["tokens"][:, 1:][batch["active"][:, 1:]].tolist())  # depth-1 teachers tokens[t+1]
    assert touched <= teacher
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in model.trunk.blocks.parameters())

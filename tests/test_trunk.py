"""Trunk: document-causal attention, per-document rotary positions, tied embeddings."""

import pytest
import torch

from lab.model.trunk import Trunk
from tests.helpers import PAD, VOCAB, make_batch, model_config

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread

# Row: document A (5 tokens) then document B (6 tokens) then one pad.
A, B = slice(0, 5), slice(5, 11)
SEGMENTS = [[0] * 5 + [1] * 6 + [-1]]


def trunk_and_tokens(seed=0, n_layers=2):
    torch.manual_seed(seed)
    trunk = Trunk(model_config(n_layers))
    tokens = torch.randint(1, VOCAB, (1, 12))
    tokens[0, 11] = PAD
    return trunk, tokens


@torch.no_grad()
def run(trunk, batch):
    ctx = trunk.attention_context(batch["segment_ids"], batch["position_ids"], batch["active"])
    return trunk(batch["tokens"], ctx)  # [B, S, d]


def test_changing_document_a_leaves_document_b_unchanged():
    trunk, tokens = trunk_and_tokens()
    out = run(trunk, make_batch(tokens, SEGMENTS))
    changed = tokens.clone()
    changed[0, A] = (tokens[0, A] + 7) % (VOCAB - 1) + 1  # every token of A differs
    assert (changed[0, A] != tokens[0, A]).all()
    out2 = run(trunk, make_batch(changed, SEGMENTS))
    torch.testing.assert_close(out2[:, B], out[:, B], atol=1e-6, rtol=0)
    assert (out2[:, A] - out[:, A]).abs().amax(-1).min() > 1e-3  # A itself did change (control)


def test_document_b_is_causal_inside_itself():
    trunk, tokens = trunk_and_tokens()
    out = run(trunk, make_batch(tokens, SEGMENTS))
    j = B.start + 2  # a middle token of B
    changed = tokens.clone()
    changed[0, j] = tokens[0, j] % (VOCAB - 1) + 1
    out2 = run(trunk, make_batch(changed, SEGMENTS))
    torch.testing.assert_close(out2[:, :j], out[:, :j], atol=1e-6, rtol=0)  # earlier rows (A and B) unchanged
    assert (out2[0, j:B.stop] - out[0, j:B.stop]).abs().amax(-1).min() > 1e-3  # every later B row changed
    # changing B's first token changes all of B's later outputs
    changed = tokens.clone()
    changed[0, B.start] = tokens[0, B.start] % (VOCAB - 1) + 1
    out3 = run(trunk, make_batch(changed, SEGMENTS))
    assert (out3[0, B] - out[0, B]).abs().amax(-1).min() > 1e-3
    torch.testing.assert_close(out3[:, A], out[:, A], atol=1e-6, rtol=0)


def test_padding_and_holes_are_not_attended():
    trunk, tokens = trunk_and_tokens()
    batch = make_batch(tokens, SEGMENTS)
    out = run(trunk, batch)
    changed = tokens.clone()
    changed[0, 11] = 5  # the pad token's id
    torch.testing.assert_close(run(trunk, make_batch(changed, SEGMENTS))[:, :11], out[:, :11], atol=1e-6, rtol=0)
    # a hole at B.start+1: rows after it must not see its token
    hole = B.start + 1
    active = batch["active"].clone()
    active[0, hole] = False
    out_hole = run(trunk, {**batch, "active": active})
    changed = tokens.clone()
    changed[0, hole] = tokens[0, hole] % (VOCAB - 1) + 1
    out_hole2 = run(trunk, {**make_batch(changed, SEGMENTS), "active": active})
    others = [t for t in range(12) if t != hole]
    torch.testing.assert_close(out_hole2[:, others], out_hole[:, others], atol=1e-6, rtol=0)
    assert torch.isfinite(out_hole).all()


def test_positions_restart_per_document():
    """B packed after A equals B alone at the start of a row, because rope uses position_ids."""
    trunk, tokens = trunk_and_tokens()
    packed = make_batch(tokens, SEGMENTS)
    assert packed["position_ids"][0, B].tolist() == list(range(6))
    alone_tokens = torch.full((1, 12), PAD)
    alone_tokens[0, :6] = tokens[0, B]
    alone = make_batch(alone_tokens, [[0] * 6 + [-1] * 6])
    out_packed, out_alone = run(trunk, packed), run(trunk, alone)
    torch.testing.assert_close(out_packed[:, B], out_alone[:, :6], atol=1e-5, rtol=1e-5)
    # Rotary attention only sees position differences, so a per-document shift is invisible;
    # control: changing one relative offset inside B (position_ids drive rope) does change B.
    gapped = packed["position_ids"].clone()
    gapped[0, B.start + 3 :] += 1  # B positions 0,1,2,4,5,6
    out_gapped = run(trunk, {**packed, "position_ids": gapped})
    torch.testing.assert_close(out_gapped[:, B.start : B.start + 3], out_alone[:, :3], atol=1e-5, rtol=1e-5)
    assert (out_gapped[0, B.start + 3 : B.stop] - out_alone[0, 3:6]).abs().max() > 1e-3


def test_tied_embedding_is_the_unembedding():
    torch.manual_seed(0)
    tied = Trunk(model_config(tie=True))
    assert tied.unembedding is tied.embed.weight
    assert sum(p is tied.embed.weight for p in tied.parameters()) == 1
    untied = Trunk(model_config(tie=False))
    assert isinstance(untied.unembedding, torch.nn.Parameter)
    assert untied.unembedding is not untied.embed.weight
    assert untied.unembedding.shape == untied.embed.weight.shape == (VOCAB, 16)
    assert any(p is untied.unembedding for p in untied.parameters())
    n_tied, n_untied = (sum(p.numel() for p in t.parameters()) for t in (tied, untied))
    assert n_untied - n_tied == VOCAB * 16
    assert not torch.equal(untied.unembedding, untied.embed.weight)  # initialised separately

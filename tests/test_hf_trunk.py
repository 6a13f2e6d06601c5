"""model=hf: a transformers causal LM as the trunk (docs/pretrained-trunks.md).

Every test builds real transformers models from config objects (random weights, nothing
downloaded) and compares the harness with transformers' own forward and loss.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lab.model.mtp import build_model
from lab.objective import evaluate_horizons
from tests.helpers import build_model as tiny_model
from tests.helpers import make_batch, packed_batch

pytestmark = pytest.mark.usefixtures("single_thread")

V = 61
FAMILIES = {
    "llama": {"model_type": "llama", "vocab_size": V, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2},
    "qwen2": {"model_type": "qwen2", "vocab_size": V, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2},
    "gpt2": {"model_type": "gpt2", "vocab_size": V, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
             "bos_token_id": 0, "eos_token_id": 0},
}


def packed(seed: int = 0) -> dict:
    """Row 0 = doc (6) + doc (5) + pad; row 1 = doc (9) + doc (3)."""
    g = torch.Generator().manual_seed(seed)
    segments = torch.tensor([[0] * 6 + [1] * 5 + [-1], [0] * 9 + [1] * 3])
    tokens = torch.randint(1, V, segments.shape, generator=g)
    tokens[segments < 0] = 0
    return make_batch(tokens, segments)


def documents(batch: dict):
    """(row, start, end) of every document occurrence."""
    for b, row in enumerate(batch["segment_ids"].tolist()):
        for segment in sorted(set(row) - {-1}):
            where = [t for t, s in enumerate(row) if s == segment]
            yield b, where[0], where[-1] + 1


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_next_token_logits_equal_transformers_on_each_document_alone(family):
    torch.manual_seed(0)
    model = build_model({"name": "hf", "config": FAMILIES[family]}, {"name": "ntp"}).eval()
    hf = model.hf_model
    batch = packed()
    logits = model.next_token_logits(batch)  # [B, S, V]
    for b, start, end in documents(batch):
        with torch.no_grad():
            alone = hf(input_ids=batch["tokens"][b : b + 1, start:end]).logits[0]  # [n, V]
        torch.testing.assert_close(logits[b, start:end], alone, atol=1e-5, rtol=0)
    # control: without the document-causal mask the second document of row 0 sees the first
    with torch.no_grad():
        unmasked = hf(input_ids=batch["tokens"][:1, :11]).logits[0, 6:11]
    assert (unmasked - logits[0, 6:11]).abs().max() > 1e-3


@pytest.mark.parametrize("family", list(FAMILIES))
def test_ntp_loss_equals_transformers_labels_loss(family):
    torch.manual_seed(1)
    model = build_model({"name": "hf", "config": FAMILIES[family]}, {"name": "ntp"}).eval()
    tokens = torch.randint(1, V, (3, 10), generator=torch.Generator().manual_seed(3))
    batch = make_batch(tokens, torch.zeros_like(tokens))  # one document per row: transformers' own layout
    stats = evaluate_horizons(model(batch))
    ours = stats.loss_sums[0] / stats.counts[0]
    with torch.no_grad():
        theirs = model.hf_model(input_ids=tokens, labels=tokens).loss
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-6)


def test_shared_parts_are_the_transformers_parameters():
    for family in FAMILIES:
        model = build_model({"name": "hf", "config": FAMILIES[family]}, {"name": "parallel", "k": 2})
        hf = model.hf_model
        assert model.shared_parts().unembedding is hf.get_output_embeddings().weight
        assert model.shared_parts().embed is hf.get_input_embeddings()
        assert model.head_cfg.compute_match == "none" and len(model.trunk.blocks) == 2
        assert (hf.get_output_embeddings().weight is hf.get_input_embeddings().weight) == (family == "gpt2")


@pytest.mark.parametrize("trunk", ["gpt", "hf"])
@pytest.mark.parametrize("unembedding", ["shared", "replicated"])
def test_fresh_medusa_heads_predict_the_next_token(trunk, unembedding):
    model = tiny_model("medusa", 4, trunk=trunk, unembedding=unembedding, n_layers=2).eval()
    batch = packed_batch()
    with torch.no_grad():
        horizons = model(batch)
        next_token = model.next_token_logits(batch)  # [B, S, V]
    for horizon in horizons[1:]:
        logits = F.linear(horizon.norm(horizon.hidden), horizon.weight)  # [B, S-k, V]
        torch.testing.assert_close(logits, next_token[:, : logits.shape[1]], atol=1e-6, rtol=0)
    # control: once W moves, the horizon-2 logits differ
    with torch.no_grad():
        model.head.blocks[0][0].linear.weight.normal_(std=0.5)
        moved = model(batch)[1]
    assert (F.linear(moved.norm(moved.hidden), moved.weight) - next_token[:, : moved.hidden.shape[1]]).abs().max() > 1e-3


def test_head_lr_multiplier_scales_only_the_head():
    from lab.training.optim import OptimConfig, build_optimizer

    model = tiny_model("parallel", 2, trunk="hf", trunk_grad="lora")
    optimizer, _ = build_optimizer(model, OptimConfig(lr=1e-3, warmup_steps=10, head_lr_multiplier=4.0), total_steps=20)
    head = {id(p) for p in model.head.parameters()}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for group in optimizer.param_groups for p in group["params"]} == trainable
    for group in [group for group in optimizer.param_groups if group["params"]]:
        owners = {id(p) in head for p in group["params"]}
        assert len(owners) == 1
        assert group["lr"] == pytest.approx((4e-3 if owners == {True} else 1e-3) / 10)  # warm-up step 0 of 10

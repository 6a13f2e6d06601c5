"""Training FLOPs per token (lab/nn/flops.py): a hand-computed block, and PyTorch's own FLOP counter."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lab.nn.flops import block_forward_flops, forward_flops_per_sequence, training_flops_per_token
from tests.head_cases import case, without
from tests.helpers import build_model, model_config, packed_batch

pytestmark = pytest.mark.usefixtures("single_thread")


def test_block_flops_hand_computed():
    # d = 16, mlp_ratio = 2, 12 rows: matmuls 2·12·(3 + 1 + 2·2)·16² = 49,152; attention 2·2·12²·16 = 9,216.
    assert block_forward_flops(model_config(), 12) == 49_152 + 9_216


def test_training_flops_per_token_hand_computed():
    # parallel K=2, 3 layers, next_token_path: 2 trunk blocks + 1 head block per horizon = 4 blocks of
    # 58,368 on 12 rows; projections 2·(12-1)·16·37 + 2·(12-2)·16·37 = 24,864; forward 258,336.
    # Training = forward + backward (2 × forward), per token of 12: 3·258,336 / 12 = 64,584.
    model = build_model("parallel", 2, layers=3)
    assert len(model.trunk.blocks) == 2
    assert forward_flops_per_sequence(model, 12) == 4 * (49_152 + 9_216) + 24_864
    assert training_flops_per_token(model, 12) == 64_584


HEADS = {  # every registered head (parallel, causal and anticausal as variants)
    **without("parallel", "causal", "anticausal"),
    "linear_replicated": case("linear", unembedding="replicated"),
    "parallel_2_layers": case("parallel", n_layers=2),
    "causal_detached": case("causal", trunk_grad="detached"),
    "anticausal_detached": case("anticausal", trunk_grad="detached"),
    "deepseek_shared": case("deepseek", share_depth_weights=True),
}


# model=hf: a tiny transformers Llama trunk, with harness or native (the Llama's own layer) head blocks
HF_HEADS = {
    "hf_parallel_2_layers": dict(name="parallel", k=3, n_layers=2, trunk="hf"),
    "hf_parallel_native": dict(name="parallel", k=3, n_layers=2, block="native", trunk="hf"),
    "hf_causal_native_detached": dict(name="causal", k=3, block="native", trunk_grad="detached", trunk="hf"),
    "hf_deepseek_native": dict(name="deepseek", k=3, depth=2, block="native", trunk="hf"),
}


@pytest.mark.parametrize("head", [*HEADS.values(), *HF_HEADS.values()], ids=[*HEADS, *HF_HEADS])
def test_forward_flops_equal_pytorchs_flop_counter(head):
    """Model forward + each horizon's vocabulary projection on all its rows, counted by FlopCounterMode.

    SDPA's math backend: the counter sees its two batched matmuls (the fused CPU kernel is not counted)."""
    model = build_model(layers=4, **{"compute_match": "none", **head})
    batch = packed_batch()  # [2, 12]
    rows, seq_len = batch["tokens"].shape
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, torch.no_grad():
        for horizon in model(batch):
            F.linear(horizon.norm(horizon.hidden), horizon.weight)  # [B, S-k, V]
    assert counter.get_total_flops() == rows * forward_flops_per_sequence(model, seq_len)


def test_compute_matched_heads_cost_about_the_same():
    """Under `blocks` matching parallel K=4 moves 4 of 8 blocks into heads: the same blocks, K-1 more projections."""
    ntp, parallel = build_model("ntp", 1, layers=8), build_model("parallel", 4, layers=8, compute_match="blocks")
    extra_projections = sum(2 * (12 - k) * 16 * 37 for k in (2, 3, 4))
    assert forward_flops_per_sequence(parallel, 12) - forward_flops_per_sequence(ntp, 12) == extra_projections

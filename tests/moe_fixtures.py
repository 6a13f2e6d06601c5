"""Tiny mixture-of-experts configs of three transformers families (random weights, nothing downloaded).

- deepseek_v3: latent attention (MLA), routed + shared experts, the first layer dense (`first_k_dense_replace`),
  sigmoid routing with the selection bias `e_score_correction_bias`;
- glm4_moe: the same router, grouped-query attention with partial rotary;
- qwen3_moe: softmax routing, no shared expert, no bias (a family without MTP layers).

Routing in all three is per token (top-k over the token's own scores, no capacity, nothing dropped), so a
token's output does not depend on the other tokens of the batch: the exactness tests hold as on dense trunks.
"""

from __future__ import annotations

V = 61  # the packed test batch (tests/test_hf_trunk.py) draws ids below 61
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False)
MOE_FAMILIES = {
    "deepseek_v3": {"model_type": "deepseek_v3", **COMMON, "moe_intermediate_size": 16, "n_routed_experts": 4,
                    "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "n_shared_experts": 1, "first_k_dense_replace": 1,
                    "kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 8},
    "glm4_moe": {"model_type": "glm4_moe", **COMMON, "moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
                 "n_group": 1, "topk_group": 1, "n_shared_experts": 1, "first_k_dense_replace": 1, "head_dim": 16,
                 "partial_rotary_factor": 0.5},
    "qwen3_moe": {"model_type": "qwen3_moe", **COMMON, "moe_intermediate_size": 16, "num_experts": 4, "num_experts_per_tok": 2,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "head_dim": 16},
}
# The MoE decoder-layer's feed-forward class of each family (what a native head block must hold).
MOE_BLOCKS = {"deepseek_v3": "DeepseekV3MoE", "glm4_moe": "Glm4MoeMoE", "qwen3_moe": "Qwen3MoeSparseMoeBlock"}


def moe_model_config(family: str, **overrides) -> dict:
    return {"name": "hf", "config": {**MOE_FAMILIES[family], **overrides}}

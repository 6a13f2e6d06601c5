"""The shipped trunk families, registered in lab/model/trunk_spec.py: the harness's GPT (lab/model/trunk.py, the
`model` group's default) and a transformers causal LM (lab/model/hf_trunk.py, `model=hf`)."""

from __future__ import annotations

from lab.errors import require
from lab.model.heads.config import BLOCKS, COMPUTE_MATCH_REMOVES, TRUNK_GRADS
from lab.model.heads import head_class
from lab.model.hf_trunk import HFModelConfig, build_hf_trunk, check_native_block, preflight_hf, tokenizer_options
from lab.nn.moe import check_router_options, router_places
from lab.model.mtp_families import family_path_refusal
from lab.nn.blocks import ModelConfig
from lab.model.trunk import Trunk
from lab.model.trunk_spec import TRUNK_SPECS, TrunkSpec, register_trunk, trunk_spec  # noqa: F401  (the lookup, with the families registered)

# ---------------------------------------------------------------- the harness's GPT


def trunk_layers(model_cfg: ModelConfig, head_cfg) -> int:
    """Trunk blocks under `head.compute_match`; refuses a model left without a trunk block."""
    removed = COMPUTE_MATCH_REMOVES[head_cfg.compute_match](head_class(head_cfg.name), head_cfg)
    n = model_cfg.n_layers - removed
    require(
        n >= 1,
        "head.compute_match",
        f"{head_cfg.compute_match} leaves {n} trunk blocks (model.n_layers={model_cfg.n_layers} minus {removed} head blocks "
        f"of head={head_cfg.name} head.k={head_cfg.k} "
        + (f"head.depth={depth}" if (depth := getattr(head_cfg, "depth", None)) is not None else f"head.n_layers={head_cfg.n_layers}")
        + "); need ≥ 1: raise model.n_layers "
        "or set head.compute_match to " + " or ".join(m for m in COMPUTE_MATCH_REMOVES if m != head_cfg.compute_match),
    )
    return n


def check_head_on_gpt(model_cfg: ModelConfig, head_cfg) -> None:
    require(head_cfg.trunk_grad != "lora", "head.trunk_grad",
            f"lora adapts a pretrained trunk: it needs model=hf; allowed here: {', '.join(g for g in TRUNK_GRADS if g != 'lora')}")
    require(head_cfg.block != "native", "head.block",
            f"native builds the Hugging Face model's own decoder layer: it needs model=hf; allowed here: {', '.join(b for b in BLOCKS if b != 'native')}")


def preflight_gpt(model_cfg: ModelConfig, head_cfg) -> None:
    """Compute matching leaves at least one trunk block; the harness decodes every GPT it builds (no refusal)."""
    trunk_layers(model_cfg, head_cfg)


def gpt_vocab_size(model: dict, vocab_size: int) -> dict:
    """The GPT's vocabulary follows the tokenizer when the config leaves it null."""
    model["vocab_size"] = model.get("vocab_size") or vocab_size
    return model


GPT = TrunkSpec(
    name="gpt",
    config=ModelConfig,
    build=lambda model_cfg, head_cfg: Trunk(model_cfg, trunk_layers(model_cfg, head_cfg)),
    check_head=check_head_on_gpt,
    preflight=preflight_gpt,
    fill_vocab_size=gpt_vocab_size,
    example={"vocab_size": 64, "d_model": 32, "n_layers": 4, "n_heads": 2},
)

# ---------------------------------------------------------------- a transformers causal LM (model=hf)


def check_head_on_hf(model_cfg: HFModelConfig, head_cfg) -> None:
    require(head_cfg.compute_match == "none", "head.compute_match",
            f"{head_cfg.compute_match} would drop layers of a pretrained trunk (model=hf); allowed: none")
    require(head_cfg.init != "copy_last" or head_cfg.block == "native", "head.init",
            "copy_last copies the last trunk layer into every head block, which needs blocks of its class: "
            "add head.block=native (or use head.init=random|copy_first_head)")


def build_hf_under_head(model_cfg: HFModelConfig, head_cfg):
    trunk = build_hf_trunk(model_cfg)
    check_native_block(trunk.hf.config, head_cfg)
    return trunk


def check_hf_model(model_cfg: HFModelConfig, model) -> None:
    """MoE balancing options against the routers trunk and heads have."""
    check_router_options(model_cfg.router, router_places(model), model.trunk.hf.config.model_type)


def hf_trained_weights(model: dict) -> str | None:
    if model.get("path"):
        return "a pretrained model.path"
    return f"model.gguf_package={model['gguf_package']}" if model.get("gguf_package") else None


HF = TrunkSpec(
    name="hf",
    config=HFModelConfig,
    build=build_hf_under_head,
    check_head=check_head_on_hf,
    preflight=lambda model_cfg, head_cfg: family_path_refusal(preflight_hf(model_cfg, head_cfg), "decoding"),
    check_model=check_hf_model,
    head_defaults={"compute_match": "none"},  # its layers are never dropped
    tokenizer_options=tokenizer_options,
    trained_weights=hf_trained_weights,
    example={"name": "hf", "config": {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                                      "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1}},
)

for spec in (GPT, HF):
    if spec.name not in TRUNK_SPECS:
        register_trunk(spec)

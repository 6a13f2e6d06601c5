"""Tiny DeepSeek-V3 folders in the released MTP layout (random weights, written here, nothing downloaded).

The main model is transformers' own DeepseekV3ForCausalLM (2 layers, the first dense, the second MoE);
MTP layer d sits at `model.layers.{1 + d}` with the released key set. Shards with an index, as releases ship.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from tests.hf_fixtures import write_tokenizer

N_MAIN = 2
DEEPSEEK = dict(
    vocab_size=300, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=N_MAIN,
    num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
    n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
    qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=128, tie_word_embeddings=False,
)


def deepseek_config(depth: int = 1, **overrides):
    from transformers import AutoConfig

    return AutoConfig.for_model("deepseek_v3", **{**DEEPSEEK, "num_nextn_predict_layers": depth, **overrides})


def mtp_block_template(config, main: dict[str, torch.Tensor], kind: str) -> dict[str, torch.Tensor]:
    """The keys of one MTP layer's block: kind "mtp" is the decoder layer transformers builds for the family's MTP
    layer (get_mtp_config: MoE for deepseek_v3), kind "trunk" the last main layer's (dense after an all-dense trunk)."""
    if kind == "trunk":
        template = f"model.layers.{N_MAIN - 1}."
        return {key[len(template):]: value for key, value in main.items() if key.startswith(template)}
    from lab.nn.native_layers import decoder_layer_class

    return decoder_layer_class(config)(config.get_mtp_config(), 0).state_dict()


def mtp_state(main: dict[str, torch.Tensor], depth: int, generator: torch.Generator, block: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The MTP layers' keys: random block weights shaped like `block`, non-trivial norms, an asymmetric eh_proj;
    shared_head.norm / shared_head.head / embed_tokens hold the main model's final norm, lm_head and embedding
    (copies on disk, aliases once loaded)."""
    d = DEEPSEEK["hidden_size"]
    state = {}
    for layer in range(N_MAIN, N_MAIN + depth):
        prefix = f"model.layers.{layer}."
        for key, value in block.items():
            noise = torch.randn(value.shape, generator=generator) * 0.2
            state[prefix + key] = (1.0 + noise) if "norm" in key else noise  # norms stay near 1
        state[prefix + "enorm.weight"] = 1.0 + 0.5 * torch.rand(d, generator=generator)
        state[prefix + "hnorm.weight"] = 0.5 + torch.rand(d, generator=generator)
        state[prefix + "eh_proj.weight"] = torch.randn(d, 2 * d, generator=generator) / (2 * d) ** 0.5
        state[prefix + "shared_head.norm.weight"] = main["model.norm.weight"].clone()
        state[prefix + "shared_head.head.weight"] = main["lm_head.weight"].clone()
        state[prefix + "embed_tokens.weight"] = main["model.embed_tokens.weight"].clone()
    return state


def per_expert(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fused expert tensors (`mlp.experts.gate_up_proj` [E, 2I, d], `down_proj` [E, d, I]) as the per-expert keys
    releases ship (`mlp.experts.{e}.gate_proj.weight` [I, d], `up_proj` [I, d], `down_proj` [d, I])."""
    out = {}
    for key, value in state.items():
        match = re.match(r"(.*\.mlp\.experts)\.(gate_up_proj|down_proj)$", key)
        if match is None:
            out[key] = value
            continue
        for e in range(value.shape[0]):
            if match.group(2) == "gate_up_proj":
                gate, up = value[e].chunk(2, dim=0)  # [2I, d] -> 2 × [I, d]
                out[f"{match.group(1)}.{e}.gate_proj.weight"], out[f"{match.group(1)}.{e}.up_proj.weight"] = gate.clone(), up.clone()
            else:
                out[f"{match.group(1)}.{e}.down_proj.weight"] = value[e].clone()  # [d, I]
    return out


def write_deepseek_release(folder: Path, depth: int = 1, *, seed: int = 0, drop: tuple[str, ...] = (), drop_layers: tuple[int, ...] = (),
                           dtypes: dict[str, torch.dtype] | None = None, config_extra: dict | None = None, tokenizer: bool = True,
                           config_overrides: dict | None = None, mtp_kind: str = "mtp", experts: str = "fused",
                           extra: dict[str, torch.Tensor] | None = None, edit=None,
                           writer: str = "shards") -> Path:
    """A DeepSeek-layout folder; `drop` removes keys, `drop_layers` whole layers, `dtypes` recasts keys, `extra` adds keys,
    `edit(state)` changes tensors in place; `config_overrides` builds another model, `config_extra` only changes config.json;
    `mtp_kind` (mtp_block_template), `experts`: fused (the installed transformers' layout) or per_expert (per_expert).
    `writer`: shards (several shards + index) or save_pretrained (the main model written by transformers' own
    `save_pretrained`, one model.safetensors with per-expert keys, and the MTP layers added to that file per expert: transformers
    has no writer for MTP layers)."""
    from huggingface_hub import save_torch_state_dict
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = deepseek_config(depth, **(config_overrides or {}))
    model = AutoModelForCausalLM.from_config(config)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        model.model.norm.weight.copy_(0.5 + torch.rand(DEEPSEEK["hidden_size"], generator=generator))  # a non-trivial final norm
    main = {key: value.detach().clone() for key, value in model.state_dict().items()}
    state = {**main, **mtp_state(main, depth, generator, mtp_block_template(config, main, mtp_kind)), **(extra or {})}
    if edit is not None:
        edit(state)
    if experts == "per_expert":
        state = per_expert(state)  # before `drop`, which may name one expert's key
    state = {key: value for key, value in state.items()
             if key not in drop and not any(key.startswith(f"model.layers.{layer}.") for layer in drop_layers)}
    for key, dtype in (dtypes or {}).items():
        state[key] = state[key].to(dtype)
    for key, value in (config_extra or {}).items():
        setattr(config, key, value)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    if tokenizer:
        write_tokenizer(folder, DEEPSEEK["vocab_size"])
    if writer == "save_pretrained":
        add_mtp_layers_to_save_pretrained(model, folder, {key: value for key, value in state.items() if key not in main})
        return folder
    save_torch_state_dict(state, folder, max_shard_size="40KB")  # several shards + model.safetensors.index.json
    return folder


def add_mtp_layers_to_save_pretrained(model, folder: Path, mtp: dict[str, torch.Tensor]) -> None:
    """transformers' save_pretrained of the main model, then the MTP layers (per expert, as save_pretrained writes experts)
    added to its model.safetensors."""
    from safetensors.torch import load_file, save_file

    model.save_pretrained(folder)  # rewrites config.json from the model: the MTP depth stays (num_nextn_predict_layers)
    written = load_file(folder / "model.safetensors")
    assert not any(".mlp.experts.gate_up_proj" in key for key in written)  # transformers writes experts one by one
    save_file({**written, **per_expert(mtp)}, folder / "model.safetensors", metadata={"format": "pt"})

"""`head.block=native`: head blocks that are the Hugging Face model's own decoder layer (model=hf).

transformers builds its MTP layers this way (DeepSeek-V3 keeps them as `model.layers.{N+d-1}`
after the N main layers): the family's decoder-layer class, constructed from the model's own
config with a layer index after the trunk's. `native_decoder_layer(config, index)` is that one
construction; `NativeLayers` holds what a head needs to build and run such layers on the rows
the harness gives every block (its AttentionContext):

- training: the packed rows' 4-D document-causal mask and per-document `position_ids`, the same
  the HF trunk gets, so a native head block never sees another document;
- decoding: positions continue after the rows its stack cache holds, and the layer's
  `cache.update(k, v, layer_idx)` lands in that harness cache (`StackCacheView`), so its rows
  stay inside the harness's cache transaction (provisional until committed).

Per-layer config lists (`layer_types`, …) are extended with the last trunk layer's entry, so a
fresh index is built as a layer of the same kind as the last trunk layer (the one
`head.init=copy_last` copies).
"""

from __future__ import annotations

import copy
import inspect
import sys
from functools import cached_property

import torch
import torch.nn as nn

from lab.errors import require


def text_config(hf_config):
    return hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config


def decoder_layer_class(hf_config) -> type[nn.Module]:
    """The family's decoder-layer class (what its causal LM stacks), from the config alone."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(hf_config)]
    module = sys.modules[model_class.__module__]
    names = list(getattr(model_class, "_no_split_modules", None) or [])
    classes = [getattr(module, name) for name in names if isinstance(getattr(module, name, None), type)]
    require(len(classes) == 1, "head.block",
            f"cannot tell {model_class.__name__}'s decoder layer (candidates: {names or 'none'}); allowed: lab")
    return classes[0]


def extend_per_layer_lists(config, n_layers: int) -> None:
    """Lists with one entry per trunk layer (`layer_types`, …) get entries up to index n_layers − 1: the last layer's."""
    trunk_layers = config.num_hidden_layers
    for name, value in list(vars(config).items()):
        if isinstance(value, list) and len(value) >= trunk_layers and len(value) < n_layers and value:
            setattr(config, name, value + [value[trunk_layers - 1]] * (n_layers - len(value)))


def fresh_layer_config(hf_config, n_layers: int):
    """A copy of the text config whose per-layer lists cover `n_layers` layers (trunk + fresh).

    MoE families that keep their first layers dense (`first_k_dense_replace`) get 0 there: a head layer is an
    MoE layer whatever its index, as transformers builds MTP layers (`PreTrainedConfig.get_mtp_config`)."""
    config = copy.deepcopy(text_config(hf_config))
    extend_per_layer_lists(config, n_layers)
    if getattr(config, "first_k_dense_replace", None):
        config.first_k_dense_replace = 0
    return config


def mtp_overrides(hf_config) -> dict:
    """What the family's MTP config (transformers' `get_mtp_config`) changes for an MTP layer: scalars as they are
    (deepseek_v3's first_k_dense_replace = 0: MTP layers are MoE even after an all-dense trunk), per-layer lists as
    the trunk's entries followed by the MTP layers'. {} for a family without MTP layers."""
    text = text_config(hf_config)
    if getattr(text, "num_mtp_layers", None) is None:
        return {}
    try:
        mtp = hf_config.get_mtp_config()
    except ValueError:  # per-layer kinds the family leaves undeclared for its MTP layers
        return {}
    n_main, overrides = text.num_hidden_layers, {}
    for name, value in vars(mtp).items():
        before = getattr(text, name, None)
        if name in ("num_hidden_layers", "per_layer_config") or name.startswith("_") or value == before:
            continue
        if isinstance(value, list):
            if isinstance(before, list):
                overrides[name] = before[:n_main] + value  # layer_idx N + d − 1 reads MTP entry d − 1
        else:
            overrides[name] = value
    return overrides


def native_decoder_layer(hf_config, layer_idx: int) -> nn.Module:
    """The family's decoder layer with index `layer_idx` (≥ num_hidden_layers for a head), built from `hf_config`.

    Weights are torch's defaults; `NativeLayers.build` gives them the model's own initialisation."""
    return decoder_layer_class(hf_config)(fresh_layer_config(hf_config, layer_idx + 1), layer_idx)


def attention_mask_for(config, mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, S, S_keys] bool (True = may attend) in the form the config's attention implementation takes:
    sdpa takes it as it is, eager adds it (0 or the dtype's minimum)."""
    if config._attn_implementation == "sdpa":
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def layer_forward_flops(layers, rows: int, d_model: int) -> int:
    """Matmul FLOPs of `layers` on one sequence of `rows` rows: 2·rows per matrix entry, plus attention's 4·rows²·d per layer."""
    matrices = sum(p.numel() for layer in layers for p in layer.parameters() if p.dim() >= 2)
    return 2 * rows * matrices + len(layers) * 4 * rows * rows * d_model


class StackCacheView:
    """What a transformers attention layer calls on its cache (`update(k, v, layer_idx)`), answered by a
    harness StackCache (lab/decode_core/cache.py): the layer's rows join that cache's transaction."""

    def __init__(self, stack_cache):
        self.stack_cache = stack_cache

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self.stack_cache.extend(layer_idx, key_states, value_states)  # [B, H_kv, cached + n, hd] each


class NativeLayers:
    """Builds and runs the HF model's own decoder layers as head blocks (one per HF trunk, `trunk.cfg.native`).

    Not an nn.Module: the rotary embedding it uses is the trunk's own module, so it keeps no second state key."""

    def __init__(self, hf_model: nn.Module):
        self.model_config = hf_model.config
        self.config = fresh_layer_config(hf_model.config, text_config(hf_model.config).num_hidden_layers)
        self.first_index = self.config.num_hidden_layers  # head layers are numbered after the trunk's
        self.rotary = getattr(hf_model.base_model, "rotary_emb", None)  # families with absolute positions have none
        self.init_weights = hf_model._init_weights  # the family's initialisation (what its post_init applies)
        self.dtype = hf_model.dtype  # model.dtype: a head layer computes in the trunk's precision

    @cached_property
    def layer_class(self) -> type[nn.Module]:
        return decoder_layer_class(self.model_config)  # resolved on first use: head.block=lab never needs it

    @cached_property
    def mtp_overrides(self) -> dict:
        return mtp_overrides(self.model_config)

    @cached_property
    def arguments_taken(self) -> set[str]:
        return set(inspect.signature(self.layer_class.forward).parameters)

    def build(self, index: int, mtp: bool = False) -> nn.Module:
        """Head layer number `index` (0-based among the head's layers): layer_idx = num_hidden_layers + index.
        `mtp`: of the kind the family builds for its MTP layer `index` (mtp_overrides), not of the last trunk layer's."""
        layer_idx = self.first_index + index
        config = self.config
        if mtp and self.mtp_overrides:
            config = copy.deepcopy(self.config)
            for name, value in self.mtp_overrides.items():
                setattr(config, name, value)
        extend_per_layer_lists(config, layer_idx + 1)
        layer = self.layer_class(config, layer_idx)
        layer.apply(self.init_weights)
        return layer.to(self.dtype)

    def positions(self, x: torch.Tensor, ctx) -> torch.Tensor:
        """[B, S] positions: the context's (packed rows restart per document), else after the stack cache's rows."""
        if ctx.position_ids is not None:
            return ctx.position_ids
        require(ctx.kv is not None, "head.block", "a native head block needs position_ids or a cache to place its rows")
        start = ctx.kv.length
        return torch.arange(start, start + x.shape[1], device=x.device)[None]  # [1, n]

    def run(self, layers, x: torch.Tensor, ctx) -> torch.Tensor:
        """x [B, S, d] through `layers` in order on the rows `ctx` describes -> [B, S, d]."""
        positions = self.positions(x, ctx)  # before any layer appends to the cache
        arguments = {"attention_mask": None if ctx.mask is None else attention_mask_for(self.config, ctx.mask, x.dtype)}
        taken = self.arguments_taken
        if "position_ids" in taken:
            arguments["position_ids"] = positions
        if ctx.kv is not None:
            cache_argument = "cache" if "cache" in taken else "past_key_values"  # families still on the pre-5.24 name
            arguments.update({cache_argument: StackCacheView(ctx.kv), "use_cache": True})
        rotary = "position_embeddings" in taken and self.rotary is not None
        for layer in layers:
            if rotary:
                arguments["position_embeddings"] = self.rotary_for(layer, x, positions)
            out = layer(x, **arguments)
            x = out[0] if isinstance(out, tuple) else out  # [B, S, d]
        return x

    @cached_property
    def rotary_per_layer_type(self) -> bool:
        """mellum-like families keep one rotary per attention kind (`layer_type`): full and sliding layers differ."""
        return "layer_type" in inspect.signature(self.rotary.forward).parameters

    def rotary_for(self, layer: nn.Module, x: torch.Tensor, positions: torch.Tensor):
        """(cos, sin) for `layer`: the trunk's rotary, of the layer's own kind where the family has several."""
        if not self.rotary_per_layer_type:
            return self.rotary(x, positions)
        attention = layer.self_attn  # built from a config whose layer_types cover its index (NativeLayers.build)
        return self.rotary(x, positions, layer_type=attention.config.layer_types[attention.layer_idx])

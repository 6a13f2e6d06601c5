"""`lab-export CKPT --format medusa --out DIR`: a `head=medusa` run on a `model=hf` trunk in vLLM's Medusa layout.

    DIR/config.json         model_type "medusa", hidden_size, vocab_size, num_heads (= K − 1),
                            num_hidden_layers (residual blocks per head), medusa_fc_bias, original_lm_head,
                            truncated_vocab_size, `base_model` (the pointer) and `lab` (what vLLM does not read)
    DIR/model.safetensors   blocks.{h}.layers.{l}.weight/.bias [d, d]/[d]; lm_heads.{h}.weight [V, d]
                            (shared unembedding: only lm_heads.0, the base's lm_head, with original_lm_head)
    DIR/base/               the trunk as a Hugging Face folder, when the run changed it (joint, LoRA merged) or
                            built it from a config; a frozen run on model.path points at that folder instead

Head h serves horizon h + 2. The pointer is the base identity of lab/model/hf_trunk.py (folder, config sha256,
weight-file sha256s); the reader refuses a base whose identity differs.

Where the final norm sits: the harness's Medusa rows are `x + SiLU(W x + b)` on the trunk state *before* the final
norm, and the final norm comes after the blocks; vLLM's Medusa applies the blocks to the target's *normed* state and
projects them without a norm. No weight change turns one into the other, so `lab.final_norm` records the harness's
order and the export says on stderr that vLLM's drafts differ (the harness's reader is exact).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from lab.errors import require
from lab.checkpoint.files import honour_umask
from lab.checkpoint.manifest import plain
from lab.model.heads import head_class
from lab.model.mtp import build_model
from lab.model.weight_check import check_weights
from lab.release.hf_folder import staged_folder, write_trunk_folder
from lab.release.layout import InitFromReader, LoadedFolder, ParentWeights, ReleaseLayout

MEDUSA_FORMAT = 1
VLLM_MODEL_TYPE = "medusa"  # vLLM's MedusaConfig.model_type
VLLM_NORM_NOTE = ("note: the harness's Medusa blocks read the trunk state before the final norm and the norm follows them; "
                  "vLLM's read the normed state and skip the norm, so vLLM's drafts differ from the harness's (lab-generate reads DIR exactly)")


def medusa_tensors(model) -> dict[str, torch.Tensor]:
    """vLLM's key → tensor (head h = horizon h + 2)."""
    head = model.head
    tensors = {}
    for h, stack in enumerate(head.blocks):  # stack: nn.Sequential of ResidualSiLU
        for layer, block in enumerate(stack):
            tensors[f"blocks.{h}.layers.{layer}.weight"] = block.linear.weight  # [d, d]
            tensors[f"blocks.{h}.layers.{layer}.bias"] = block.linear.bias  # [d]
    if head.projections is None:  # shared: every head projects with the base's lm_head
        tensors["lm_heads.0.weight"] = model.trunk.unembedding  # [V, d]
    else:
        for h, projection in enumerate(head.projections):
            tensors[f"lm_heads.{h}.weight"] = projection  # [V, d]
    return {key: value.detach().clone().contiguous() for key, value in tensors.items()}


def points_at_base(model) -> bool:
    """The base folder itself serves as the trunk: the run read it from model.path and never changed it."""
    identity = model.trunk.base_identity
    return identity["path"] is not None and model.head_cfg.trunk_grad == "frozen"


def export_medusa(checkpoint: dict, out: Path, model) -> str:
    """Write `out` (all or nothing) from a model=hf, head=medusa checkpoint loaded as `model`; returns what lab-export prints."""
    from safetensors.torch import save_file

    require(isinstance(model.head, head_class("medusa")), "--format", f"medusa exports head=medusa runs; this checkpoint's head is '{model.head_cfg.name}'")
    require(model.trunk.transformers_model is not None, "--format", "medusa needs a model=hf trunk (vLLM serves a Hugging Face base); this run trains the harness's GPT")
    trunk, head_cfg = model.trunk, model.head_cfg
    with staged_folder(out) as tmp:
        if points_at_base(model):
            base = dict(trunk.base_identity)
        else:
            write_trunk_folder(checkpoint, model, tmp / "base")
            base = {**base_identity_of_folder(tmp / "base", trunk.hf.config), "path": "base"}
        config = {
            "model_type": VLLM_MODEL_TYPE, "architectures": ["MedusaModel"],
            "hidden_size": trunk.cfg.d_model, "vocab_size": trunk.cfg.vocab_size, "truncated_vocab_size": trunk.cfg.vocab_size,
            "num_heads": model.k - 1, "num_hidden_layers": head_cfg.n_layers,
            "medusa_fc_bias": True, "original_lm_head": head_cfg.unembedding == "shared",
            "base_model": base,
            "lab": {"format": MEDUSA_FORMAT, "head": plain(head_cfg), "final_norm": "after_blocks",
                    "dtype": model.model_cfg.dtype, "attn_implementation": model.model_cfg.attn_implementation},
        }
        save_file(medusa_tensors(model), tmp / "model.safetensors", metadata={"format": "pt"})
        honour_umask(tmp / "model.safetensors")
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    print(VLLM_NORM_NOTE, file=sys.stderr)
    return f"medusa folder: {out} ({config['num_heads']} heads × {config['num_hidden_layers']} blocks; base: {config['base_model']['path']})"


def base_identity_of_folder(folder: Path, hf_config) -> dict:
    """The identity lab/model/hf_trunk.py gives a base read from `folder` (what the reader recomputes)."""
    from lab.model.hf_trunk import HFModelConfig, base_identity

    class ConfigOnly:  # base_identity reads the model's config and, for a folder, the weight files on disk
        config = hf_config

    return base_identity(HFModelConfig(path=str(folder)), ConfigOnly())


# ------------------------------------------------------------------------ the reader


def is_medusa_folder(path: Path) -> bool:
    config = path / "config.json"
    if not (path.is_dir() and config.is_file() and (path / "model.safetensors").is_file()):
        return False
    try:
        values = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False  # unreadable: not recognisably a Medusa export (the harness's own loader names the defect)
    return isinstance(values, dict) and values.get("model_type") == VLLM_MODEL_TYPE


def load_medusa(folder: str | Path):
    """The MTPModel of a Medusa export in eval mode: the base it points at (identity checked) and the heads."""
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    lab = config.get("lab") or {}
    require(lab.get("final_norm") == "after_blocks", "config.json", "lab.final_norm must be after_blocks (the order the harness trains); "
                                                                     "a Medusa folder from elsewhere puts the norm before the blocks")
    pointer = config["base_model"]
    base_path = base_of(folder, pointer["path"])
    head = {**lab["head"], "name": "medusa", "k": config["num_heads"] + 1, "n_layers": config["num_hidden_layers"],
            "unembedding": "shared" if config["original_lm_head"] else "replicated", "trunk_grad": "frozen",
            "draft_vocab": None}  # the layout holds no draft ids: its heads draft over the full vocabulary
    model = build_model({"name": "hf", "path": str(base_path), "dtype": lab.get("dtype", "float32"),
                         "attn_implementation": lab.get("attn_implementation", "sdpa")}, head)
    built = model.trunk.base_identity
    for key in ("config_sha256", "weights_sha256"):
        require(built[key] == pointer[key], "base_model", f"{key} of the base at {base_path} differs from the one config.json names; give that base")
    tensors = load_file(folder / "model.safetensors")
    check_weights(tensors, "release", str(folder / "model.safetensors"))  # copy_ would cast an int8 tensor into the float heads
    load_medusa_tensors(model, tensors)
    return model.eval()


def load_medusa_tensors(model, tensors: dict[str, torch.Tensor]) -> None:
    own = medusa_tensors(model)
    missing, extra = sorted(set(own) - set(tensors)), sorted(set(tensors) - set(own))
    require(not missing and not extra, "model.safetensors", f"keys do not fit config.json: missing {missing[:3]}, unexpected {extra[:3]}")
    for key, value in tensors.items():
        require(value.shape == own[key].shape, "model.safetensors", f"{key} has shape {tuple(value.shape)}, config.json needs {tuple(own[key].shape)}")
    if model.head.projections is None:
        require(torch.equal(tensors["lm_heads.0.weight"], own["lm_heads.0.weight"]), "model.safetensors",
                "lm_heads.0.weight differs from the base's lm_head although original_lm_head is true")
    with torch.no_grad():
        for h, stack in enumerate(model.head.blocks):
            for layer, block in enumerate(stack):
                block.linear.weight.copy_(tensors[f"blocks.{h}.layers.{layer}.weight"])
                block.linear.bias.copy_(tensors[f"blocks.{h}.layers.{layer}.bias"])
        if model.head.projections is not None:
            for h, projection in enumerate(model.head.projections):
                projection.copy_(tensors[f"lm_heads.{h}.weight"])


def medusa_tokenizer(folder: str | Path):
    """The base's own tokenizer (written beside the base, or in the folder the pointer names)."""
    from lab.data.hf_tokenizer import HFTokenizer

    folder = Path(folder)
    return HFTokenizer(str(base_of(folder, json.loads((folder / "config.json").read_text())["base_model"]["path"])), "base_model")


def base_of(folder: Path, pointer: str) -> Path:
    """The base the pointer names: `base` beside the heads, or a path of its own."""
    return Path(pointer) if Path(pointer).is_absolute() else folder / pointer


def weight_folders(folder: Path) -> list[Path]:
    """The heads' folder and, when the pointer names a folder, the base's (a GGUF base is checked as it converts)."""
    pointer = (json.loads((folder / "config.json").read_text()).get("base_model") or {}).get("path")  # is_medusa_folder read it
    base = None if not isinstance(pointer, str) else base_of(folder, pointer)
    return [folder] + ([base] if base is not None and base.is_dir() else [])


def load_for_generation(folder: Path) -> LoadedFolder:
    return LoadedFolder(load_medusa(folder), medusa_tokenizer(folder))


def parent_weights(folder: Path, model) -> ParentWeights:
    """A `lab-export --format medusa` folder as a parent of `init_from`: its base (identity checked) and its heads."""
    medusa = load_medusa(folder)
    return ParentWeights(medusa.state_dict(), {"vocab_size": medusa.trunk.cfg.vocab_size}, medusa_tokenizer(folder).identity, medusa.head_cfg.name)


LAYOUT = ReleaseLayout("medusa", "a head=medusa run on model=hf in vLLM's Medusa layout beside a pointer to its base",
                       export_medusa, recognizes=is_medusa_folder, load=load_for_generation,
                       init_from=InitFromReader(kind="medusa", read=parent_weights, identity_file=lambda folder: folder / "model.safetensors",
                                                weight_folders=weight_folders))

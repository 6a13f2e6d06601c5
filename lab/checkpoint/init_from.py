"""`init_from=<checkpoint | run dir | release dir | Medusa folder | hf:DeepSeek-layout folder>`: start a run from another model's weights (weights only).

Nothing but tensors is taken: no optimizer state, step, λ position or RNG (that is a resume,
`ckpt_path`). Two-stage recipes use it: train a next-token model, then train heads on it with
`head.trunk_grad=frozen`. The parent must have the same tokenizer and vocabulary, and every
trunk weight of this model must be in the parent with the same shape; head weights are taken
where the parent has them and freshly initialised (from the loaded trunk) where it has not.
The parent's sha256 (the checkpoint file, or a release's model.safetensors) goes into the manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lab.checkpoint.loading import load_checkpoint
from lab.checkpoint.manifest import plain
from lab.errors import ConfigError, require


HF_PREFIX = "hf:"  # init_from=hf:<folder>: a Hugging Face folder in the DeepSeek MTP layout (lab/checkpoint/import_deepseek.py)


def parent_files(source: str | Path) -> tuple[str, Path]:
    """("checkpoint" | "release" | "medusa" | "hf", the file whose sha256 identifies the parent)."""
    if str(source).startswith(HF_PREFIX):
        folder = Path(str(source)[len(HF_PREFIX):]).expanduser()
        require((folder / "config.json").is_file(), "init_from", f"{source}: no Hugging Face folder (config.json) at {folder}")
        index = folder / "model.safetensors.index.json"
        return "hf", index if index.is_file() else folder / "model.safetensors"
    path = Path(source)
    from lab.checkpoint.export_medusa import is_medusa_folder

    if is_medusa_folder(path):
        return "medusa", path / "model.safetensors"
    if path.is_dir() and (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return "release", path / "model.safetensors"
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt"
    require(path.is_file(), "init_from", f"no checkpoint, run dir (checkpoints/last.ckpt) or release dir (config.json + model.safetensors) at {source}")
    return "checkpoint", path


def hf_folder_weights(folder: Path, model) -> tuple[dict[str, torch.Tensor], dict, dict, str | None]:
    """A DeepSeek-layout folder as a parent: its main model, and its depths when this run's head drafts the same chain
    (the folder's eh_proj columns put in this head's declared order). A folder without its MTP layers gives a target only."""
    from lab.checkpoint.import_deepseek import deepseek_head, load_deepseek_folder
    from lab.data.hf_tokenizer import HFTokenizer

    wants_depths = "deepseek" in model.head.release_layouts
    imported = load_deepseek_folder(folder, head_order=model.head_cfg.fusion_order if wants_depths else "he")
    tokenizer = HFTokenizer(str(folder), "init_from").identity if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file() else {}
    state = imported.model.state_dict()
    if not wants_depths:
        return {key: value for key, value in state.items() if key.startswith("trunk.")}, {"vocab_size": imported.model.trunk.cfg.vocab_size}, tokenizer, None
    require(imported.proposer_refusal is None, "init_from", imported.proposer_refusal or "")
    expected = deepseek_head(imported.report.depth, model.head_cfg.fusion_order)
    for key in ("depth", "block", "hidden_input") + (("chain_state",) if imported.report.depth > 1 else ()):
        require(getattr(model.head_cfg, key, None) == expected[key], f"head.{key}",
                f"the folder's depths compute with head.{key}={expected[key]} (what transformers runs); this run has {getattr(model.head_cfg, key, None)}")
    return state, {"vocab_size": imported.model.trunk.cfg.vocab_size}, tokenizer, "deepseek"


def medusa_folder_weights(folder: Path, model) -> tuple[dict[str, torch.Tensor], dict, dict, str | None]:
    """A `lab-export --format medusa` folder: its base (identity checked) and its heads."""
    from lab.checkpoint.export_medusa import load_medusa, medusa_tokenizer

    medusa = load_medusa(folder)
    return medusa.state_dict(), {"vocab_size": medusa.trunk.cfg.vocab_size}, medusa_tokenizer(folder).identity, medusa.head_cfg.name


# Parents that are folders in a layout outside the harness: kind -> reader(folder, this run's model)
FOLDER_READERS = {"hf": hf_folder_weights, "medusa": medusa_folder_weights}


def parent_weights(kind: str, path: Path, model=None) -> tuple[dict[str, torch.Tensor], dict, dict, str | None]:
    """(model state keyed like MTPModel.state_dict, the parent's model config, its tokenizer identity, its head name)."""
    if kind in FOLDER_READERS:
        return FOLDER_READERS[kind](path.parent, model)
    if kind == "release":
        from safetensors.torch import load_file

        config = json.loads((path.parent / "config.json").read_text())
        return load_file(path), config["model"], config.get("tokenizer") or {}, (config.get("head") or {}).get("name")
    checkpoint = load_checkpoint(path)
    manifest = checkpoint.get("mtp_manifest")
    require(isinstance(manifest, dict), "init_from", f"{path} has no MTP manifest (not written by lab-train)")
    state = {key.removeprefix("model."): value for key, value in checkpoint["state_dict"].items()}
    return state, manifest["model"], manifest.get("tokenizer") or {}, manifest.get("head")


def check_same_head(state: dict, parent_head: str | None, head: str) -> None:
    """Head weights load only into the architecture that trained them: two heads can share parameter names
    and shapes (causal and parallel stacks do) while wiring them differently."""
    if parent_head is None or parent_head == head or not any(key.startswith("head.") for key in state):
        return
    raise ConfigError("init_from", f"the parent's head is '{parent_head}' and this run's is '{head}': its head weights "
                      f"would load into another architecture; start from a parent with head={head}, or one without head weights (head=ntp)")


def check_parent_fits(state: dict, parent: tuple[dict, dict, str | None], model, tokenizer: dict | None) -> None:
    parent_model, parent_tokenizer, parent_head = parent
    vocab, parent_vocab = model.model_cfg.vocab_size, parent_model.get("vocab_size")
    require(parent_vocab == vocab, "init_from", f"vocab_size differs: the parent has {parent_vocab}, this run has {vocab}")
    if tokenizer is not None:
        require(parent_tokenizer == tokenizer, "init_from", f"tokenizer differs: the parent has {parent_tokenizer}, this run has {tokenizer}")
    check_same_head(state, parent_head, model.head_cfg.name)
    own = model.state_dict()
    foreign = sorted(set(state) - set(own))
    if foreign:
        more = f" ({len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise ConfigError("init_from", f"the parent's {foreign[0]} has no place in this model{more}")
    missing = sorted(key for key in own if key.startswith("trunk.") and key not in state)
    if missing:
        raise ConfigError("init_from", f"the parent has no {missing[0]} (the trunk must come from it whole)")
    for key, tensor in state.items():
        require(tuple(tensor.shape) == tuple(own[key].shape), "init_from",
                f"{key} has shape {tuple(tensor.shape)} in the parent, this model needs {tuple(own[key].shape)}")


def load_parent_weights(model, source: str, tokenizer: dict | None = None) -> dict:
    """Copy the parent's weights into `model` in place; returns the manifest's `init_from` record."""
    kind, path = parent_files(source)
    state, *parent = parent_weights(kind, path, model)
    state.pop("draft_ids", None)  # a draft vocabulary is chosen from the child's own training data (head.draft_vocab)
    check_parent_fits(state, tuple(parent), model, None if tokenizer is None or not parent[1] else plain(tokenizer))
    model.load_state_dict(state, strict=False)
    if not any(key.startswith("head.") for key in state):
        model.head.initialize(model.trunk)  # head init options (copy_last, …) read the loaded trunk
    from lab.checkpoint.export import sha256_file

    return {"source": str(Path(source).resolve()), "kind": kind, "sha256": sha256_file(path)}

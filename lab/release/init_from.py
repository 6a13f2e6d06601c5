"""`init_from=<checkpoint | run dir | release dir | a head's release layout folder (Medusa folder, hf:DeepSeek-layout folder)>`: start a run from another model's weights (weights only).

Nothing but tensors is taken: no optimizer state, step, λ position or RNG (that is a resume,
`ckpt_path`). Two-stage recipes use it: train a next-token model, then train heads on it with
`head.trunk_grad=frozen`. The parent must have the same tokenizer and vocabulary, and every
trunk weight of this model must be in the parent with the same shape; head weights are taken
where the parent has them and freshly initialised (from the loaded trunk) where it has not.
The parent's sha256 (the checkpoint file, or a release's model.safetensors) goes into the manifest.

Every parent gets the weight check (lab/model/weight_check.py: no quantised dtype, no NaN / inf) before the run folder
exists (`check_parent`, from lab/config/preflight.py), and again where its reader loads it.
"""

from __future__ import annotations

from pathlib import Path

import torch

from lab.checkpoint.loading import load_checkpoint
from lab.checkpoint.manifest import plain
from lab.errors import ConfigError, require
from lab.release import InitFromReader, init_from_readers, layout_of_folder


def folder_reader(source: str | Path) -> tuple[InitFromReader, Path] | None:
    """The reader of a registered release layout that takes `source` (by its prefix, or by recognising the folder)."""
    for reader in init_from_readers().values():
        if reader.prefix is not None and str(source).startswith(reader.prefix):
            folder = Path(str(source)[len(reader.prefix):]).expanduser()
            require((folder / "config.json").is_file(), "init_from", f"{source}: no Hugging Face folder (config.json) at {folder}")
            return reader, folder
    layout = layout_of_folder(Path(source))
    if layout is not None and layout.init_from is not None and layout.init_from.prefix is None:
        return layout.init_from, Path(source)
    return None


def parent_files(source: str | Path) -> tuple[str, Path]:
    """("checkpoint" | "release" | a release layout's reader kind, the file whose sha256 identifies the parent)."""
    found = folder_reader(source)
    if found is not None:
        reader, folder = found
        return reader.kind, reader.identity_file(folder)
    path = Path(source)
    if path.is_dir() and (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        return "release", path / "model.safetensors"
    if path.is_dir():
        path = path / "checkpoints" / "last.ckpt"
    require(path.is_file(), "init_from", f"no checkpoint, run dir (checkpoints/last.ckpt) or release dir (config.json + model.safetensors) at {source}")
    return "checkpoint", path


def parent_weights(kind: str, path: Path, model=None) -> tuple[dict[str, torch.Tensor], dict, dict, str | None]:
    """(model state keyed like MTPModel.state_dict, the parent's model config, its tokenizer identity, its head name)."""
    readers = init_from_readers()
    if kind in readers:
        parent = readers[kind].read(path.parent, model)
        return parent.state, parent.model, parent.tokenizer, parent.head
    if kind == "release":
        from lab.release.export import load_release, release_config

        config = release_config(path.parent)
        released = load_release(path.parent)  # what lab-generate reads: config.json against its tensors, the weight check
        return released.state_dict(), config["model"], config.get("tokenizer") or {}, (config.get("head") or {}).get("name")
    checkpoint = load_checkpoint(path)
    manifest = checkpoint.get("mtp_manifest")
    require(isinstance(manifest, dict), "init_from", f"{path} has no MTP manifest (not written by lab-train)")
    state = {key.removeprefix("model."): value for key, value in checkpoint["state_dict"].items()}
    return state, manifest["model"], manifest.get("tokenizer") or {}, manifest.get("head")


def check_parent(source: str) -> None:
    """What `init_from=source` reads, refused in one line before the run folder exists: a checkpoint as ckpt_path's is
    (safe loading, digest, the weight check), a release as lab-generate reads it (config.json against its tensors, the
    weight check), a release layout's folders by the weight check of the files its reader reads."""
    kind, path = parent_files(source)
    if kind == "checkpoint":
        load_checkpoint(path)
    elif kind == "release":
        from lab.release.export import load_release

        load_release(path.parent)
    else:
        from lab.model.hf_weights import check_folder_weights

        for folder in init_from_readers()[kind].weight_folders(path.parent):
            check_folder_weights(folder, "init_from")


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
    from lab.release.export import sha256_file

    return {"source": str(Path(source).resolve()), "kind": kind, "sha256": sha256_file(path)}

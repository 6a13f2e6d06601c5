"""What `lab-generate` decodes with: the model, its tokenizer and its context length.

Accepts a training checkpoint (`.ckpt`, loaded with weights_only=True), a run directory
(its `checkpoints/last.ckpt`), a release directory written by `lab-export`, or a folder in a head's
release layout (lab/release/).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from lab.errors import ConfigError


@dataclass
class Loaded:
    model: object  # MTPModel in eval mode
    tokenizer: object  # lab.data.tokenizers.ByteTokenizer | BPETokenizer
    context: int | None  # training sequence length (longest prompt accepted); None if unknown
    source: str  # "checkpoint", "release", or the release layout's format name ("medusa", "deepseek")
    proposer_refusal: str | None = None  # why the model may not draft (a DeepSeek-layout folder without its MTP layers)


def tokenizer_from_payload(payload: dict | None, manifest: dict):
    from lab.data.tokenizers import tokenizer_from_identity

    identity = (payload or {}).get("identity") or manifest.get("tokenizer") or {}
    tokenizer = tokenizer_from_identity(identity, (payload or {}).get("json"))
    if tokenizer is not None:
        return tokenizer
    raise ConfigError("checkpoint", f"carries no usable tokenizer (identity {identity or 'missing'})")


def load_for_generation(path: str | os.PathLike) -> Loaded:
    path = Path(path)
    from lab.release import layout_of_folder

    layout = layout_of_folder(path)  # a folder in a head's release layout (Medusa, DeepSeek)
    if layout is not None and layout.load is not None:
        loaded = layout.load(path)
        return Loaded(loaded.model, loaded.tokenizer, None, layout.name, loaded.proposer_refusal)
    if path.is_dir() and (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        from lab.release.export import load_release, load_release_tokenizer, release_config

        config = release_config(path)
        context = (config.get("parent_manifest") or {}).get("seq_len")
        return Loaded(load_release(path), load_release_tokenizer(path), context, "release")
    if path.is_dir():
        candidate = path / "checkpoints" / "last.ckpt"
        if not candidate.is_file():
            raise ConfigError("checkpoint", f"{path} is neither a release folder (config.json + model.safetensors) nor a run dir with checkpoints/last.ckpt")
        path = candidate
    from lab.checkpoint import load_checkpoint
    from lab.release.export import model_from_checkpoint

    checkpoint = load_checkpoint(path)
    model = model_from_checkpoint(checkpoint)
    manifest = checkpoint["mtp_manifest"]
    return Loaded(model, tokenizer_from_payload(checkpoint.get("mtp_tokenizer"), manifest), manifest.get("seq_len"), "checkpoint")

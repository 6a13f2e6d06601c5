"""What `lab-generate` decodes with: the model, its tokenizer and its context length.

Accepts a training checkpoint (`.ckpt`, loaded with weights_only=True), a run directory
(its `checkpoints/last.ckpt`) or a release directory written by `lab-export`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from lab.errors import ConfigError


@dataclass
class Loaded:
    model: object  # MTPModel in eval mode
    tokenizer: object  # lab.data.tokenizers.ByteTokenizer | BPETokenizer
    context: int | None  # training sequence length (longest prompt accepted); None if unknown
    source: str  # "checkpoint", "release", "medusa" or "deepseek"
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
    from lab.checkpoint.export_medusa import is_medusa_folder

    if is_medusa_folder(path):
        from lab.checkpoint.export_medusa import load_medusa, medusa_tokenizer

        return Loaded(load_medusa(path), medusa_tokenizer(path), None, "medusa")
    from lab.checkpoint.import_deepseek import is_deepseek_folder

    if is_deepseek_folder(path):
        from lab.checkpoint.import_deepseek import load_deepseek_folder
        from lab.data.hf_tokenizer import HFTokenizer

        imported = load_deepseek_folder(path)
        return Loaded(imported.model, HFTokenizer(str(path), "DIR"), None, "deepseek", imported.proposer_refusal)
    if path.is_dir() and (path / "config.json").is_file() and (path / "model.safetensors").is_file():
        from lab.checkpoint.export import load_release, load_release_tokenizer

        config = json.loads((path / "config.json").read_text())
        context = (config.get("parent_manifest") or {}).get("seq_len")
        return Loaded(load_release(path), load_release_tokenizer(path), context, "release")
    if path.is_dir():
        candidate = path / "checkpoints" / "last.ckpt"
        if not candidate.is_file():
            raise ConfigError("checkpoint", f"{path} is neither a release folder (config.json + model.safetensors) nor a run dir with checkpoints/last.ckpt")
        path = candidate
    from lab.checkpoint import load_checkpoint
    from lab.checkpoint.export import model_from_checkpoint

    checkpoint = load_checkpoint(path)
    model = model_from_checkpoint(checkpoint)
    manifest = checkpoint["mtp_manifest"]
    return Loaded(model, tokenizer_from_payload(checkpoint.get("mtp_tokenizer"), manifest), manifest.get("seq_len"), "checkpoint")

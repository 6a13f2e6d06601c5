"""Checkpoint semantics: the manifest, safe loading and validation, RNG state.

An MTP checkpoint only means something together with its semantics: which weight
belongs to which horizon, which names are one Parameter, which λ schedule and reduction
produced it, on which tokenizer and corpus. `build_manifest` records that in plain
dicts, lists and scalars (so `torch.load(weights_only=True)` reads it back), and
`validate_checkpoint` refuses a checkpoint whose manifest, aliases or tensors disagree
with the composed config — one line naming the first differing field.

Checkpoints are written by `lab.checkpoint_io.SafeCheckpointIO` (atomic, with the
content digest that `load_checkpoint` verifies).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pickle
import random
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lab.errors import ConfigError
from lab.model.mtp import alias_groups
from lab.run_record import package_versions

MANIFEST_FORMAT = 1
# Rows pack EOS-terminated documents; segment_ids number document occurrences in a row
# (-1 = padding), position_ids restart at 0 in every document, attention is document-causal.
PACKING = "eos-packed/segment-ids/position-restart/v1"
# Head containers whose index i holds horizon i + offset (a DeepSeek depth d predicts d + 1).
HORIZON_CONTAINERS = {"stacks": 1, "maps": 1, "projections": 1, "depth_modules": 2}
# Manifest entries that must agree for a resume, in the order they are checked, with the
# config field each one names in an error. Versions and the schedule position are state, not config.
CHECKED_FIELDS = {
    "format": "manifest.format",
    "head": "head.name",
    "k": "head.k",
    "depth": "head.depth",
    "head_config": "head",
    "tokenizer": "tokenizer",
    "corpus_fingerprint": "data.corpus_fingerprint",
    "model": "model",
    "packing": "data.packing",
    "seq_len": "data.seq_len",
    "batch_size": "data.batch_size",
    "data_seed": "data.seed",
    "weights": "weights",
    "reduction": "reduction.policy",
    "count_scope": "reduction.count_scope",
    "fixed_denominator": "reduction.fixed_denominator",
    "schedule": "schedule.name",
    "chunk_rows": "schedule.chunk_rows",
    "horizons": "horizons",
    "aliases": "aliases",
}


# ---------------------------------------------------------------------------- manifest


def plain(value: Any) -> Any:
    """Dicts, lists and scalars only: safe for weights_only loading and for JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise TypeError(f"not a plain manifest value: {type(value).__name__}")


def head_key_horizon(name: str, shared_depth: bool) -> int | str:
    """Horizon of one head parameter (name relative to the head); "all" for a shared DeepSeek module."""
    container, _, rest = name.partition(".")
    index = rest.split(".", 1)[0]
    if container not in HORIZON_CONTAINERS or not index.isdigit():
        raise ValueError(f"no horizon rule for head parameter '{name}' (known containers: {', '.join(HORIZON_CONTAINERS)})")
    if container == "depth_modules" and shared_depth:
        return "all"
    return int(index) + HORIZON_CONTAINERS[container]


def horizon_map(model) -> dict[str, int | str]:
    """Every `model.head.*` state key → the horizon it serves."""
    shared = bool(model.head_cfg.share_depth_weights)
    return {f"model.head.{name}": head_key_horizon(name, shared) for name in model.head.state_dict()}


def alias_key_groups(model) -> list[list[str]]:
    """State keys that must hold one tensor because they are one Parameter.

    Registered duplicates come from `alias_groups`. A tied unembedding has no key of its
    own; `trunk.unembed` is where an untied one lives, so a tied checkpoint that carries
    it with other values holds a broken alias.
    """
    groups = [[f"model.{name}" for name in names] for names in alias_groups(model)]
    if model.model_cfg.tie_embeddings:
        groups.append(["model.trunk.embed.weight", "model.trunk.unembed"])
    return groups


def build_manifest(module, datamodule=None) -> dict:
    """What a checkpoint (and run.json) of `module` means; `datamodule` supplies tokenizer and corpus."""
    model, hp = module.model, module.hparams
    datamodule = _lm_data(datamodule)
    data = None if datamodule is None else datamodule.config
    return {
        "format": MANIFEST_FORMAT,
        "head": model.head_cfg.name,
        "k": model.k,
        "depth": getattr(model.head, "depth", None),
        "head_config": plain(model.head_cfg),
        "model": plain(model.model_cfg),
        "horizons": horizon_map(model),
        "aliases": alias_key_groups(model),
        "weights": plain(hp.weights),
        "weight_position": {"step": int(module.global_step), "consumed_tokens": int(module.consumed_tokens)},
        "reduction": module.policy,
        "count_scope": module.count_scope,
        "fixed_denominator": module.fixed_denominator,
        "schedule": module.backward_schedule.name,
        "chunk_rows": plain(hp.schedule.get("chunk_rows")),
        "packing": PACKING,
        "seq_len": None if data is None else data.seq_len,
        "batch_size": None if data is None else data.batch_size,
        "data_seed": None if data is None else data.seed,
        "tokenizer": None if datamodule is None else plain(datamodule.tokenizer_identity),
        "corpus_fingerprint": None if datamodule is None else datamodule.corpus_fingerprint,
        "versions": package_versions(),
    }


def _lm_data(datamodule):
    """The datamodule when it is an LMDataModule (plain loaders and test doubles have no tokenizer)."""
    return datamodule if hasattr(datamodule, "tokenizer_identity") and hasattr(datamodule, "config") else None


def tokenizer_payload(datamodule) -> dict | None:
    """The tokenizer travels with the checkpoint (identity, and for BPE its JSON) so a release can ship it."""
    datamodule = _lm_data(datamodule)
    if datamodule is None:
        return None
    inner = getattr(datamodule.tokenizer, "_tokenizer", None)  # the HF tokenizer behind a BPE
    return {"identity": plain(datamodule.tokenizer_identity), "json": None if inner is None else inner.to_str()}


# -------------------------------------------------------------------------- comparison


def _short(value: Any) -> str:
    text = "missing" if value is _MISSING else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


_MISSING = object()


def first_difference(saved: Any, expected: Any, path: str) -> str | None:
    """`path differs: checkpoint has X, config has Y` for the first differing leaf, else None."""
    if isinstance(saved, dict) and isinstance(expected, dict):
        # A group's `name`/`kind` first: "weights.name differs" says more than a missing option.
        for key in sorted(set(saved) | set(expected), key=lambda k: (k not in ("name", "kind"), str(k))):
            found = first_difference(saved.get(key, _MISSING), expected.get(key, _MISSING), f"{path}.{key}")
            if found:
                return found
        return None
    if saved == expected and type(saved) is type(expected):
        return None
    if isinstance(saved, (int, float)) and isinstance(expected, (int, float)) and not isinstance(saved, bool) and saved == expected:
        return None  # 1 and 1.0 are the same setting
    return f"{path} differs: checkpoint has {_short(saved)}, config has {_short(expected)}"


def compare_manifests(saved: dict, expected: dict) -> None:
    for key, field in CHECKED_FIELDS.items():
        found = first_difference(saved.get(key, _MISSING), expected.get(key, _MISSING), field)
        if found:
            raise ConfigError("checkpoint", found)


# ---------------------------------------------------------------------- safe loading


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:160]}" if lines else type(error).__name__


def _siblings(path: Path) -> str:
    others = sorted(p.name for p in path.parent.glob("*.ckpt") if p.name != path.name)
    return f"other checkpoints in {path.parent}: {', '.join(others)}" if others else f"no other checkpoint in {path.parent}"


def load_checkpoint(path: str | os.PathLike) -> dict:
    """torch.load with weights_only=True; a damaged or unsafe file is one ConfigError line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("checkpoint", f"no such checkpoint file: {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch reports both unsafe globals and plain garbage this way; only the former is a pickle of code.
        unsafe = re.search(r"Unsupported global: GLOBAL (\S+)", str(error))
        if unsafe:
            raise ConfigError("checkpoint", f"{path} holds {unsafe.group(1)}, which safe (weights_only) loading refuses to unpickle") from None
        raise ConfigError("checkpoint", f"{path} is truncated or corrupted (not a readable checkpoint); {_siblings(path)}") from None
    except (RuntimeError, EOFError, OSError, KeyError, ValueError, IndexError, zipfile.BadZipFile) as error:
        raise ConfigError("checkpoint", f"{path} is truncated or corrupted ({_first_line(error)}); {_siblings(path)}") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ConfigError("checkpoint", f"{path} is not a training checkpoint (no state_dict); {_siblings(path)}")
    digest = checkpoint.get("mtp_digest")
    if digest is not None and digest != content_digest(checkpoint):
        raise ConfigError("checkpoint", f"{path} is corrupted (content digest mismatch); {_siblings(path)}")
    return checkpoint


def content_digest(checkpoint: dict) -> str:
    """sha256 over every value in the checkpoint (tensor bytes included), except the digest itself."""
    h = hashlib.sha256()

    def visit(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key in sorted(value, key=repr):
                if not (path == "" and key == "mtp_digest"):
                    visit(value[key], f"{path}/{key!r}")
        elif isinstance(value, (list, tuple)):
            h.update(f"{path}:{type(value).__name__}{len(value)};".encode())
            for i, item in enumerate(value):
                visit(item, f"{path}/{i}")
        elif isinstance(value, torch.Tensor):
            flat = value.detach().cpu().contiguous().reshape(-1)
            h.update(f"{path}:{flat.dtype}{tuple(value.shape)};".encode())
            h.update(flat.view(torch.uint8).numpy().tobytes())
        else:
            h.update(f"{path}={value!r};".encode())

    visit(checkpoint, "")
    return h.hexdigest()


# ------------------------------------------------------------------------- validation


def check_state_aliases(state: dict, groups: list[list[str]]) -> None:
    """Every alias group present in `state` holds one tensor; otherwise the checkpoint is refused."""
    for group in groups:
        present = [key for key in group if key in state]
        for key in present[1:]:
            if state[key].shape != state[present[0]].shape or not torch.equal(state[key], state[present[0]]):
                raise ConfigError(
                    "checkpoint",
                    f"broken alias: {present[0]} and {key} are one Parameter in this model but differ in the checkpoint; refusing it",
                )


def check_state_keys(state: dict, module) -> None:
    """Same keys and shapes as the module, so Lightning's strict load cannot fail half-way."""
    expected = module.state_dict()
    unexpected, missing = sorted(set(state) - set(expected)), sorted(set(expected) - set(state))
    if unexpected or missing:
        what = f"unexpected key {unexpected[0]}" if unexpected else f"missing key {missing[0]}"
        more = len(unexpected) + len(missing) - 1
        raise ConfigError("checkpoint", f"state_dict: {what}" + (f" ({more} more differ)" if more else ""))
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise ConfigError("checkpoint", f"state_dict: {key} has shape {tuple(state[key].shape)}, the model needs {tuple(tensor.shape)}")


def validate_checkpoint(path: str | os.PathLike, expected: dict, module) -> dict:
    """Load `path` safely and refuse it unless it is a checkpoint of this very experiment."""
    checkpoint = load_checkpoint(path)
    manifest = checkpoint.get("mtp_manifest")
    if not isinstance(manifest, dict):
        raise ConfigError("checkpoint", f"{path} has no MTP manifest (not written by lab-train); refusing to resume from it")
    compare_manifests(manifest, expected)
    check_state_aliases(checkpoint["state_dict"], expected["aliases"])
    check_state_keys(checkpoint["state_dict"], module)
    return checkpoint


def verify_restored(module, optimizer=None, groups: list[list[str]] | None = None) -> None:
    """After a load: every alias group is one Parameter object, and the optimizer holds each Parameter once.

    `groups` are the state keys that were one Parameter before the load (the checkpoint's
    manifest); recomputing them afterwards would not see a group that the load split.
    """
    model = module.model
    named = dict(module.named_parameters(remove_duplicate=False))
    for group in alias_key_groups(model) if groups is None else groups:
        objects = {id(named[name]) for name in group if name in named}
        if len(objects) > 1:
            raise RuntimeError(f"alias group {group} is no longer one Parameter after loading")
    if model.model_cfg.tie_embeddings and model.trunk.unembedding is not model.trunk.embed.weight:
        raise RuntimeError("the tied unembedding is no longer the embedding Parameter after loading")
    if optimizer is None:
        return
    params = {id(p): p for p in module.parameters()}
    bound = [id(p) for group in optimizer.param_groups for p in group["params"]]
    if len(bound) != len(set(bound)) or set(bound) != set(params):
        raise RuntimeError("the optimizer does not hold every Parameter exactly once")
    if any(id(p) not in params for p in optimizer.state):
        raise RuntimeError("the optimizer holds state for a tensor that is not a model Parameter")


# -------------------------------------------------------------------------- RNG state


def collect_rng_states() -> dict:
    """torch, numpy and python RNG states as tensors, ints and tuples (weights_only-safe)."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    numpy = states["numpy"]
    keys = numpy["keys"].numpy().astype(np.uint32)
    np.random.set_state((numpy["name"], keys, numpy["pos"], numpy["has_gauss"], numpy["gauss"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])

"""Safe checkpoint loading: weights_only, content digest, and refusal of anything that does not fit.

`validate_checkpoint` refuses a checkpoint whose manifest, aliases or tensors disagree with
the composed config — one line naming the first differing field. Checkpoints are written
by `lab.checkpoint.io.SafeCheckpointIO` (atomic, with the content digest that
`load_checkpoint` verifies).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import pickletools
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from lab.checkpoint.base_model import with_base_weights
from lab.checkpoint.manifest import alias_key_groups, compare_manifests
from lab.model.weight_check import check_weights
from lab.errors import ConfigError

# ---------------------------------------------------------------------- safe loading


def _first_line(error: BaseException) -> str:
    """The error's first sentence, whole (torch's zip errors go on with advice after it)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0].split('. ')[0].rstrip('.')}" if lines else type(error).__name__


def _siblings(path: Path) -> str:
    others = sorted(p.name for p in path.parent.glob("*.ckpt") if p.name != path.name)
    return f"other checkpoints in {path.parent}: {', '.join(others)}" if others else f"no other checkpoint in {path.parent}"


def unsafe_globals(path: Path) -> list[str]:
    """The globals torch's safe loading refuses in `path` ([] when there are none or the file cannot be scanned).

    A zip checkpoint: torch's own scan. A legacy (pre-zip) torch.save file or a plain pickle: its
    pickle opcodes, read without running any of them, against torch's own list of safe globals."""
    if zipfile.is_zipfile(path):
        try:
            return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        except Exception:  # truncated: then it is damaged, not unsafe
            return []
    safe = set(torch.serialization.get_safe_globals()) | set(safe_default_globals())
    return [name for name in pickled_globals(path) if name not in safe]


def safe_default_globals() -> list[str]:
    try:
        from torch._weights_only_unpickler import _get_allowed_globals  # what weights_only loading accepts by default

        return list(_get_allowed_globals())
    except Exception:  # another torch: every global then counts as unsafe, which only errs on the refusing side
        return []


LEGACY_PICKLES = 5  # torch.save's legacy format: magic number, protocol, system info, the object, storage keys


def pickled_globals(path: Path) -> list[str]:
    """`module.name` of every global the pickle stream(s) of `path` would import, in order, without unpickling."""
    found: list[str] = []
    with open(path, "rb") as handle:
        for _ in range(LEGACY_PICKLES):
            strings, memo = [], {}
            try:
                for opcode, arg, _ in pickletools.genops(handle):
                    if opcode.name == "GLOBAL":
                        found.append(arg.replace(" ", "."))
                    elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                        found.append(".".join(strings[-2:]))
                    elif opcode.name == "MEMOIZE" and strings:
                        memo[len(memo)] = strings[-1]
                    elif opcode.name in ("BINPUT", "LONG_BINPUT", "PUT") and strings:
                        memo[arg] = strings[-1]
                    elif opcode.name in ("BINGET", "LONG_BINGET", "GET") and arg in memo:
                        strings.append(memo[arg])
                    elif isinstance(arg, str):
                        strings.append(arg)
            except Exception:  # the raw storage bytes after the last pickle, or a damaged stream
                break
    return list(dict.fromkeys(found))


def load_checkpoint(path: str | os.PathLike) -> dict:
    """torch.load with weights_only=True; a damaged or unsafe file is one ConfigError line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("checkpoint", f"no such checkpoint file: {path}")
    try:
        with warnings.catch_warnings():  # torch's note on an unusual pickle protocol: the line below says what matters
            warnings.simplefilter("ignore", UserWarning)
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        # torch reports both unsafe globals and plain garbage this way; only the former is a pickle of code.
        unsafe = unsafe_globals(path)
        if unsafe:
            raise ConfigError("checkpoint", f"{path} holds {', '.join(unsafe)}, which safe (weights_only) loading refuses to unpickle") from None
        raise ConfigError("checkpoint", f"{path} is truncated or corrupted (not a readable checkpoint); {_siblings(path)}") from None
    except (RuntimeError, EOFError, OSError, KeyError, ValueError, IndexError, zipfile.BadZipFile) as error:
        raise ConfigError("checkpoint", f"{path} is truncated or corrupted ({_first_line(error)}); {_siblings(path)}") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ConfigError("checkpoint", f"{path} is not a training checkpoint (no state_dict); {_siblings(path)}")
    digest = checkpoint.get("mtp_digest")
    if digest is not None and digest != content_digest(checkpoint):
        raise ConfigError("checkpoint", f"{path} is corrupted (content digest mismatch); {_siblings(path)}")
    check_weights(checkpoint["state_dict"], "checkpoint", str(path))
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
    state = with_base_weights(checkpoint["state_dict"], module)  # frozen / LoRA runs save what trains only
    check_state_aliases(state, expected["aliases"])
    check_state_keys(state, module)
    return checkpoint


def verify_restored(module, optimizer=None, groups: list[list[str]] | None = None) -> None:
    """After a load: every alias group is one Parameter object, and the optimizer holds each trainable Parameter once.

    `groups` are the state keys that were one Parameter before the load (the checkpoint's
    manifest); recomputing them afterwards would not see a group that the load split.
    """
    model = module.model
    named = dict(module.named_parameters(remove_duplicate=False))
    for group in alias_key_groups(model) if groups is None else groups:
        objects = {id(named[name]) for name in group if name in named}
        if len(objects) > 1:
            raise RuntimeError(f"alias group {group} is no longer one Parameter after loading")
    if getattr(model.model_cfg, "tie_embeddings", False) and model.trunk.unembedding is not model.trunk.embed.weight:
        raise RuntimeError("the tied unembedding is no longer the embedding Parameter after loading")
    if optimizer is None:
        return
    params = {id(p): p for p in module.parameters() if p.requires_grad}  # frozen Parameters are never bound
    # An optimizer with float32 master weights (lab/training/master_weights.py) maps each master to its Parameter.
    to_model = getattr(optimizer, "model_parameter", lambda tensor: tensor)
    bound = [id(to_model(p)) for group in optimizer.param_groups for p in group["params"]]
    if len(bound) != len(set(bound)) or set(bound) != set(params):
        raise RuntimeError("the optimizer does not hold every Parameter exactly once")
    if any(id(to_model(p)) not in params for p in optimizer.state):
        raise RuntimeError("the optimizer holds state for a tensor that is not a model Parameter")

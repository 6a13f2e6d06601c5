"""Checkpoints of frozen and LoRA runs on a pretrained trunk hold only what trains.

The weights of a base read from model.path never change in those runs, so its state keys stay out of the
checkpoint; the manifest's `base` entry (path, config and weight sha256) names it instead, and
resume refuses a checkpoint whose base differs (lab/checkpoint/manifest.py compares it).
"""

from __future__ import annotations

from lab.errors import ConfigError

FIXED_BASE_MODES = ("frozen", "lora")


def base_state_keys(model) -> set[str]:
    """LightningModule state keys (`model.…`) of the base weights a frozen or LoRA run never changes; empty otherwise
    (and for a random-weight base built from model.config, which no folder could give back)."""
    identity = getattr(model.trunk, "base_identity", None)
    if identity is None or identity["path"] is None or model.head_cfg.trunk_grad not in FIXED_BASE_MODES:
        return set()
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    return {f"model.{name}" for name in model.state_dict() if name.startswith("trunk.hf.") and name not in trainable}


def drop_base_weights(checkpoint: dict, model) -> None:
    skipped = base_state_keys(model)
    if skipped:
        checkpoint["state_dict"] = {key: value for key, value in checkpoint["state_dict"].items() if key not in skipped}


def with_base_weights(state: dict, module, prefix: str = "model.") -> dict:
    """A trimmed checkpoint's state completed with `module`'s own base weights (identity checked by the manifest).
    `module`: the LightningModule (keys `model.…`), or the MTPModel itself with `prefix=""`."""
    model = module.model if prefix else module
    skipped = {key.removeprefix("model.") if not prefix else key for key in base_state_keys(model)}
    stray = sorted(key for key in skipped if key in state)
    if stray:
        raise ConfigError("checkpoint", f"state_dict holds base weight {stray[0]} that a {model.head_cfg.trunk_grad} run never saves")
    if not skipped:
        return state
    own = module.state_dict()
    return {**state, **{key: own[key] for key in skipped}}


def check_same_base(saved: dict | None, model) -> None:
    """The checkpoint's base model (its manifest's `base`) is the one `model` was built on; one line otherwise."""
    built = getattr(model.trunk, "base_identity", None)
    if saved is None or saved == built or not base_state_keys(model):  # base weights stored in the checkpoint itself
        return
    what = next((key for key in saved if saved.get(key) != (built or {}).get(key)), "base")
    raise ConfigError("model.path", f"the checkpoint was trained on another base model ({what} differs: "
                                    f"checkpoint's base at {saved.get('path') or 'a model.config'}); give that model")

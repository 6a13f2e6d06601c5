"""The checkpoint manifest: what an MTP checkpoint means, and the comparison that refuses a foreign one.

An MTP checkpoint only means something together with its semantics: which weight
belongs to which horizon, which names are one Parameter, which λ schedule and reduction
produced it, on which tokenizer and corpus. `build_manifest` records that in plain
dicts, lists and scalars (so `torch.load(weights_only=True)` reads it back);
`compare_manifests` names the first field where a checkpoint and the composed config differ.
"""

from __future__ import annotations

import dataclasses
import platform
from importlib import metadata
from typing import Any

from lab.errors import ConfigError
from lab.objective.targets import TargetConfig
from lab.model.mtp import alias_groups


PACKAGES = ("torch", "pytorch-lightning", "hydra-core", "wandb", "datasets", "tokenizers", "mtp-lab")


def package_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions

MANIFEST_FORMAT = 1
# Rows pack EOS-terminated documents; segment_ids number document occurrences in a row
# (-1 = padding), position_ids restart at 0 in every document, attention is document-causal.
PACKING = "eos-packed/segment-ids/position-restart/v1"
# Manifest entries that must agree for a resume, in the order they are checked, with the
# config field each one names in an error. Versions and the schedule position are state, not config.
CHECKED_FIELDS = {
    "format": "manifest.format",
    "head": "head.name",
    "k": "head.k",
    "depth": "head.depth",
    "head_config": "head",
    "base": "model.path",
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
    "offsets": "head.offsets",
    "target": "objective",
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


def horizon_map(model) -> dict[str, int | str]:
    """Every `model.head.*` state key → the horizon it serves (the head class knows: `horizon_of`)."""
    return {f"model.head.{name}": model.head.horizon_of(name) for name in model.head.state_dict()}


def alias_key_groups(model) -> list[list[str]]:
    """State keys that must hold one tensor because they are one Parameter.

    Registered duplicates come from `alias_groups`. A tied unembedding has no key of its
    own; `trunk.unembed` is where an untied one lives, so a tied checkpoint that carries
    it with other values holds a broken alias.
    """
    groups = [[f"model.{name}" for name in names] for names in alias_groups(model)]
    if getattr(model.model_cfg, "tie_embeddings", False):  # a HF model lists its tied names itself (alias_groups)
        groups.append(["model.trunk.embed.weight", "model.trunk.unembed"])
    return groups


def build_manifest(module, datamodule=None) -> dict:
    """What a checkpoint (and run.json) of `module` means; `datamodule` supplies tokenizer and corpus."""
    model, hp, objective = module.model, module.hparams, module.objective
    datamodule = _lm_data(datamodule)
    data = None if datamodule is None else datamodule.config
    return {
        "format": MANIFEST_FORMAT,
        "head": model.head_cfg.name,
        "k": model.k,
        "depth": getattr(model.head, "depth", None),
        "head_config": plain(model.head_cfg),
        "offsets": list(model.head.offsets),
        "model": plain(model.model_cfg),
        # model=hf: the pretrained base's identity (lab/model/hf_trunk.py base_identity); None for the GPT
        "base": getattr(model.trunk, "base_identity", None),
        "horizons": horizon_map(model),
        "aliases": alias_key_groups(model),
        "weights": plain(hp.weights),
        "weight_position": {"step": int(module.global_step), "consumed_tokens": int(module.consumed_tokens)},
        "reduction": objective.reduction.policy,
        "count_scope": objective.reduction.count_scope,
        "fixed_denominator": objective.reduction.fixed_denominator,
        "schedule": objective.schedule.name,
        "chunk_rows": objective.schedule.chunk_rows,
        "packing": PACKING,
        "seq_len": None if data is None else data.seq_len,
        "batch_size": None if data is None else data.batch_size,
        "data_seed": None if data is None else data.seed,
        "tokenizer": None if datamodule is None else plain(datamodule.tokenizer_identity),
        "corpus_fingerprint": None if datamodule is None else datamodule.corpus_fingerprint,
        "target": plain(objective.target),
        "init_from": getattr(module, "init_from", None),  # {source, kind, sha256} of the parent weights, or None
        "versions": package_versions(),
    }


def _lm_data(datamodule):
    """The datamodule when it has a tokenizer and a data config (LMDataModule, SyntheticDataModule; plain loaders
    and test doubles have neither)."""
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


def with_later_defaults(saved: dict) -> dict:
    """A manifest written before leap offsets and distilled targets existed, read as what it trained:
    offsets 1..K and data targets (the defaults then and now), so such checkpoints still resume."""
    saved = dict(saved)
    k = saved.get("k")
    if "offsets" not in saved and isinstance(k, int):
        saved["offsets"] = list(range(1, k + 1))
    if isinstance(saved.get("head_config"), dict):  # fields added since (offsets, lora, draft_vocab, a chain's rollout, ...)
        saved["head_config"] = {**head_config_defaults(saved["head_config"].get("name")), **saved["head_config"]}
    saved.setdefault("base", None)  # written before pretrained trunks existed: the harness's own GPT
    saved.setdefault("target", {"target": "data", "mix_alpha": 0.5})
    if isinstance(saved["target"], dict) and "teacherless" not in saved["target"]:
        saved["target"] = {**saved["target"], "teacherless": False}  # written before teacherless inputs existed
    if isinstance(saved["target"], dict):  # written before acceptance targets and truncation: neither was used
        saved["target"] = {**field_defaults(TargetConfig), **saved["target"]}
    return saved


def field_defaults(config_class) -> dict:
    """The fields of a config dataclass that have a default, with it."""
    return {f.name: f.default for f in dataclasses.fields(config_class) if f.default is not dataclasses.MISSING}


def head_config_defaults(name) -> dict:
    """A head config's fields with defaults: what a manifest written before a field existed trained with (every
    field is added with the default that keeps the earlier behaviour: offsets 1..K, no LoRA, the full vocabulary,
    teacher forcing)."""
    from lab.model.heads import HEAD_SPECS

    if name not in HEAD_SPECS:
        return {}
    return field_defaults(HEAD_SPECS[name].module.config_class)  # a saved field always wins over its default


def compare_manifests(saved: dict, expected: dict) -> None:
    saved = with_later_defaults(saved)
    for key, field in CHECKED_FIELDS.items():
        found = first_difference(saved.get(key, _MISSING), expected.get(key, _MISSING), field)
        if found:
            raise ConfigError("checkpoint", found)

"""The DeepSeek MTP layout on disk (docs/releases.md): what config.json and the safetensors headers say.

A Hugging Face folder of a family that declares MTP layers keeps depth d (1..D) after the N main
layers as `model.layers.{N+d-1}.*`: `enorm`, `hnorm`, `eh_proj` [d, 2d], `shared_head.norm`,
`shared_head.head` [V, d], `embed_tokens` [V, d] and the block's own keys (the decoder layer transformers
builds for the family's MTP layer), with `num_nextn_predict_layers` = D in config.json.

`lab-export --check` (lab/release/deepseek/check.py) is the loader's verdict: it runs `load_deepseek_folder`, the
code `lab-generate`, `init_from=hf:` and a run from the folder run, and reports its two gates apart: target-only completeness
(the main model loads with every weight, none quantised, none left over but the MTP layers) and MTP
completeness (transformers' own MTP loader reads every MTP weight, nothing missing, unexpected or
mis-shaped, and the harness's depths take them). PASS on both means those loaders accept the folder.

The fusion order (which half of eh_proj's input columns is the embedding) is what transformers' MtpLayer
runs for the family (`mtp_hidden_states_first`); a config.json `mtp_fusion_order` that says otherwise is refused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from lab.errors import ConfigError, require
from lab.model.hf_weights import tensor_table

FUSION_ORDERS = ("he", "eh")
LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# A layer's routed experts on disk: per expert (`mlp.experts.{e}.gate_proj.weight`, what transformers' save_pretrained and
# the released checkpoints write) or grouped (`mlp.experts.gate_up_proj` [E, 2I, d], the installed transformers' parameters).
PER_EXPERT_KEY = re.compile(r"^mlp\.experts\.(\d+)\.")
GROUPED_KEY = "mlp.experts.gate_up_proj"
PER_EXPERT_PARTS = ("gate_proj.weight", "up_proj.weight", "down_proj.weight")  # what each expert holds per expert


@dataclass
class LayoutReport:
    """What config.json and the safetensors headers say, before anything is loaded."""

    folder: Path
    family: str
    n_main: int
    depth: int
    declared_order: str | None  # config.json's mtp_fusion_order, if any
    held: dict[int, int] = field(default_factory=dict)  # MTP layer id → keys the folder holds for it
    experts: dict[int, str] = field(default_factory=dict)  # MTP layer id → its routed experts on disk ("4 routed experts, per expert")
    missing_expert_keys: dict[int, list[str]] = field(default_factory=dict)  # MTP layer id → per-expert keys it lacks

    @property
    def mtp_layer_ids(self) -> list[int]:
        return list(range(self.n_main, self.n_main + self.depth))

    @property
    def first_mtp_problem(self) -> str:
        """One line when the folder holds no MTP layer to load ("" otherwise)."""
        if self.depth < 1:
            return "config.json declares no MTP layers (num_nextn_predict_layers / num_mtp_layers missing or 0)"
        empty = [layer for layer in self.mtp_layer_ids if not self.held.get(layer)]
        if empty:
            return f"MTP layer {empty[0]} (model.layers.{empty[0]}.*) is missing entirely"
        gaps = [(layer, keys) for layer, keys in sorted(self.missing_expert_keys.items()) if keys and layer in self.mtp_layer_ids]
        if gaps:
            layer, keys = gaps[0]
            return f"{keys[0]} is missing: MTP layer {layer} stores its experts one by one and lacks {len(keys)} expert weight(s)"
        return ""


def read_config(folder: Path) -> dict:
    require(folder.is_dir(), "DIR", f"no such folder: {folder}")
    path = folder / "config.json"
    require(path.is_file(), "DIR", f"{folder} has no config.json (not a Hugging Face model folder)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError("config.json", f"is not JSON ({error})") from None
    return config.get("text_config", config) if "num_hidden_layers" not in config else config


def mtp_depth(config: dict) -> int:
    value = config.get("num_nextn_predict_layers", config.get("num_mtp_layers")) or 0
    require(isinstance(value, int) and value >= 0, "num_nextn_predict_layers", f"must be an integer ≥ 0, got {value!r}")
    return value


def inspect_layout(folder: str | Path) -> LayoutReport:
    folder = Path(folder)
    config = read_config(folder)
    n_main, depth = config.get("num_hidden_layers"), mtp_depth(config)
    require(isinstance(n_main, int) and n_main >= 1, "num_hidden_layers", f"config.json needs the main layer count, got {n_main!r}")
    order = config.get("mtp_fusion_order")
    require(order is None or order in FUSION_ORDERS, "mtp_fusion_order",
            f"unknown '{order}'; allowed: he ([hidden, embedding]), eh ([embedding, hidden])")
    held: dict[int, int] = {}
    table = tensor_table(folder)
    for key in table:
        if (match := LAYER_KEY.match(key)) and int(match.group(1)) >= n_main:
            held[int(match.group(1))] = held.get(int(match.group(1)), 0) + 1
    experts = {layer: expert_line(table, layer) for layer in held}
    routed = next((config[key] for key in ("n_routed_experts", "num_experts", "num_local_experts") if isinstance(config.get(key), int)), 0)
    missing = {layer: missing_per_expert_keys(table, layer, routed) for layer in held}
    return LayoutReport(folder, str(config.get("model_type")), n_main, depth, order, held, experts, missing)


def expert_ids(table: dict, prefix: str) -> set[int]:
    return {int(match.group(1)) for key in table if key.startswith(prefix) and (match := PER_EXPERT_KEY.match(key[len(prefix):]))}


def missing_per_expert_keys(table: dict, layer: int, routed: int) -> list[str]:
    """The per-expert keys a layer stored one expert at a time lacks, for experts 0..E−1 (E: config.json's routed count,
    or the highest id found + 1); [] for a grouped or dense layer."""
    prefix = f"model.layers.{layer}."
    ids = expert_ids(table, prefix)
    if not ids:
        return []
    count = max(routed, max(ids) + 1)
    return [f"{prefix}mlp.experts.{e}.{part}" for e in range(count) for part in PER_EXPERT_PARTS
            if f"{prefix}mlp.experts.{e}.{part}" not in table]


def expert_line(table: dict, layer: int) -> str:
    """How many routed experts layer `layer` holds and in which layout ("dense" when it holds none)."""
    prefix = f"model.layers.{layer}."
    grouped = table.get(prefix + GROUPED_KEY)
    if grouped is not None:
        return f"{grouped.shape[0]} routed experts, grouped ({GROUPED_KEY} {list(grouped.shape)})"
    ids = expert_ids(table, prefix)
    return f"{len(ids)} routed experts, per expert (mlp.experts.{{e}}.*)" if ids else "dense (no routed experts)"

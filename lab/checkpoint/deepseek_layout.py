"""The DeepSeek MTP layout on disk (M7.6 §0x07A–§0x07D) and `lab-export --check DIR`.

A Hugging Face folder of a family that declares MTP layers keeps depth d (1..D) after the N main
layers as `model.layers.{N+d-1}.*`: `enorm`, `hnorm`, `eh_proj` [d, 2d], `shared_head.norm`,
`shared_head.head` [V, d], `embed_tokens` [V, d] and the block's own keys (the same key set and
shapes as the last main layer's), with `num_nextn_predict_layers` = D in config.json.

Two gates, reported apart (§0x07D): target-only completeness (transformers loads the main model
with no missing or mis-shaped key and it generates) and MTP completeness (layer ids N..N+D−1
reconcile with the config and every MTP key is there with its shape). A release that dropped
layer N passes the first and fails the second.

The fusion order (which half of eh_proj's input columns is the embedding) is read from a
declaration, never from shapes: config.json's `mtp_fusion_order` (he | eh), else transformers'
own `mtp_hidden_states_first` flag, else the family's loader convention (FAMILY_FUSION_ORDER).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lab.errors import ConfigError, require

FUSION_ORDERS = ("he", "eh")
# transformers 5.24 (MtpLayer) and vLLM's DeepSeek MTP loader concatenate [embedding, hidden] for these families.
FAMILY_FUSION_ORDER = {"deepseek_v3": "eh", "glm4_moe": "eh"}
# The MTP module's own keys (besides its block) and their shapes in units of (d, V).
MTP_OWN_KEYS = {
    "enorm.weight": ("d",), "hnorm.weight": ("d",), "eh_proj.weight": ("d", "2d"),
    "shared_head.norm.weight": ("d",), "shared_head.head.weight": ("V", "d"), "embed_tokens.weight": ("V", "d"),
}
LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# Storage dtypes of quantized weights (each needs scales and a loader that knows them).
LOW_PRECISION = {torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.uint8}


@dataclass
class TensorInfo:
    shape: tuple[int, ...]
    dtype: torch.dtype
    file: str


@dataclass
class MTPLayerReport:
    layer: int
    expected: int
    present: int
    missing: list[str] = field(default_factory=list)
    misshaped: list[str] = field(default_factory=list)  # "key: (shape) where (expected) is needed"


@dataclass
class LayoutReport:
    folder: Path
    family: str
    n_main: int
    depth: int
    d: int
    vocab: int
    fusion_order: str | None
    fusion_source: str
    target_ok: bool = False
    target_detail: str = ""
    layers: list[MTPLayerReport] = field(default_factory=list)
    stray_layers: list[int] = field(default_factory=list)  # ids ≥ N + D that hold keys
    dtype_anomalies: list[str] = field(default_factory=list)

    @property
    def mtp_layer_ids(self) -> list[int]:
        return list(range(self.n_main, self.n_main + self.depth))

    @property
    def mtp_ok(self) -> bool:
        return self.depth >= 1 and all(not r.missing and not r.misshaped for r in self.layers) and not self.stray_layers

    @property
    def first_mtp_problem(self) -> str:
        """One line saying why MTP completeness fails ("" when it holds)."""
        if self.depth < 1:
            return "config.json declares no MTP layers (num_nextn_predict_layers / num_mtp_layers missing or 0)"
        for report in self.layers:
            if report.present == 0:
                return f"MTP layer {report.layer} (model.layers.{report.layer}.*) is missing entirely"
            if report.missing:
                return f"MTP layer {report.layer} lacks {report.missing[0]}" + (f" ({len(report.missing) - 1} more)" if len(report.missing) > 1 else "")
            if report.misshaped:
                return f"MTP layer {report.layer}: {report.misshaped[0]}"
        if self.stray_layers:
            return f"layer ids {self.stray_layers} hold keys beyond N + D − 1 = {self.n_main + self.depth - 1} (num_nextn_predict_layers={self.depth})"
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


def declared_fusion_order(config: dict) -> tuple[str | None, str]:
    """(he | eh | None, where the declaration came from)."""
    if "mtp_fusion_order" in config:
        order = config["mtp_fusion_order"]
        require(order in FUSION_ORDERS, "mtp_fusion_order", f"unknown '{order}'; allowed: he ([hidden, embedding]), eh ([embedding, hidden])")
        return order, "config.json mtp_fusion_order"
    if "mtp_hidden_states_first" in config:
        return ("he" if config["mtp_hidden_states_first"] else "eh"), "config.json mtp_hidden_states_first (transformers' flag)"
    family = config.get("model_type")
    if family in FAMILY_FUSION_ORDER:
        return FAMILY_FUSION_ORDER[family], f"the {family} loaders' convention (transformers 5.24, vLLM)"
    return None, "undeclared"


def weight_files(folder: Path) -> dict[str, str]:
    """key → safetensors file name, from the index (sharded) or the single model.safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    single = folder / "model.safetensors"
    require(single.is_file(), "DIR", f"{folder} has neither model.safetensors nor model.safetensors.index.json")
    from safetensors import safe_open

    with safe_open(single, "pt") as handle:
        return {key: single.name for key in handle.keys()}


def tensor_table(folder: Path) -> dict[str, TensorInfo]:
    """Every key's shape and dtype, read from the safetensors headers (no tensor is loaded).
    A key the index names but its shard lacks is left out (it is missing)."""
    from safetensors import safe_open

    by_file: dict[str, list[str]] = {}
    for key, name in weight_files(folder).items():
        by_file.setdefault(name, []).append(key)
    table = {}
    for name, keys in by_file.items():
        path = folder / name
        require(path.is_file(), "model.safetensors.index.json", f"names shard {name}, which is not in {folder}")
        with safe_open(path, "pt") as handle:
            held = set(handle.keys())
            for key in keys:
                if key in held:
                    part = handle.get_slice(key)
                    table[key] = TensorInfo(tuple(part.get_shape()), getattr(torch, dtype_name(part.get_dtype())), name)
    return table


SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "F8_E4M3": "float8_e4m3fn",
                      "F8_E5M2": "float8_e5m2", "I8": "int8", "U8": "uint8", "I32": "int32", "I64": "int64", "BOOL": "bool"}


def dtype_name(code: str) -> str:
    return SAFETENSORS_DTYPES.get(code, "uint8")  # other packed codes (I4, F8_E8M0, …) are byte storage too


def expected_mtp_keys(layer: int, template: dict[str, TensorInfo], template_layer: int, d: int, vocab: int) -> dict[str, tuple[int, ...]]:
    """The keys (and shapes) MTP layer `layer` must hold: its own six and the block keys of the last main layer."""
    units = {"d": d, "2d": 2 * d, "V": vocab}
    keys = {f"model.layers.{layer}.{name}": tuple(units[u] for u in shape) for name, shape in MTP_OWN_KEYS.items()}
    prefix = f"model.layers.{template_layer}."
    keys |= {f"model.layers.{layer}.{key[len(prefix):]}": info.shape for key, info in template.items() if key.startswith(prefix)}
    return keys


def inspect_layout(folder: str | Path, *, load_target: bool = True) -> LayoutReport:
    folder = Path(folder)
    config = read_config(folder)
    n_main, depth = config.get("num_hidden_layers"), mtp_depth(config)
    require(isinstance(n_main, int) and n_main >= 1, "num_hidden_layers", f"config.json needs the main layer count, got {n_main!r}")
    for name in ("hidden_size", "vocab_size"):
        require(isinstance(config.get(name), int), name, f"config.json needs it (an integer), got {config.get(name)!r}")
    order, source = declared_fusion_order(config)
    table = tensor_table(folder)
    report = LayoutReport(folder, str(config.get("model_type")), n_main, depth, config["hidden_size"], config["vocab_size"], order, source)
    main_dtypes = {info.dtype for key, info in table.items() if not is_mtp_key(key, n_main) and info.dtype.is_floating_point}
    for layer in report.mtp_layer_ids:
        expected = expected_mtp_keys(layer, table, n_main - 1, report.d, report.vocab)
        present = [key for key in expected if key in table]
        layer_report = MTPLayerReport(layer, len(expected), len(present), missing=sorted(set(expected) - set(present)))
        layer_report.misshaped = [f"{key} has shape {table[key].shape} where {expected[key]} is needed" for key in present if table[key].shape != expected[key]]
        report.layers.append(layer_report)
        report.dtype_anomalies += [dtype_anomaly(key, table[key].dtype, main_dtypes) for key in present
                                   if table[key].dtype not in main_dtypes and (table[key].dtype.is_floating_point or table[key].dtype in LOW_PRECISION)]
    held_ids = {int(m.group(1)) for key in table if (m := LAYER_KEY.match(key))}
    report.stray_layers = sorted(i for i in held_ids if i >= n_main + depth)
    if load_target:
        report.target_ok, report.target_detail = target_gate(folder, n_main, depth)
    return report


def dtype_anomaly(key: str, dtype: torch.dtype, main_dtypes: set) -> str:
    line = f"{key} is {str(dtype).removeprefix('torch.')} while the main layers' weights are {', '.join(sorted(str(t).removeprefix('torch.') for t in main_dtypes))}"
    return line + (" (quantized-looking: needs its scales and a loader that knows them)" if dtype in LOW_PRECISION else "")


def is_mtp_key(key: str, n_main: int) -> bool:
    match = LAYER_KEY.match(key)
    return match is not None and int(match.group(1)) >= n_main


def target_gate(folder: Path, n_main: int, depth: int) -> tuple[bool, str]:
    """transformers loads the main model (no missing or mis-shaped key) and it generates a few tokens."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # its load report lists the MTP keys as unexpected; this gate says it in one line
    transformers_logging.disable_progress_bar()
    try:
        model, info = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, output_loading_info=True, dtype=torch.float32)
    except (OSError, ValueError, RuntimeError, KeyError) as error:
        return False, f"transformers cannot load it ({str(error).splitlines()[0][:200]})"
    finally:
        transformers_logging.set_verbosity(verbosity)
    missing = sorted(info.get("missing_keys") or [])
    mismatched = sorted(str(item) for item in info.get("mismatched_keys") or [])
    if missing:
        return False, f"the main model lacks {missing[0]}" + (f" ({len(missing) - 1} more)" if len(missing) > 1 else "")
    if mismatched:
        return False, f"mis-shaped main weight {mismatched[0]}"
    prompt = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        logits = model.eval()(input_ids=prompt).logits  # [1, 4, V]
        if not torch.isfinite(logits).all():
            return False, "the main model's logits are not finite"
        new = model.generate(prompt, max_new_tokens=2, do_sample=False, pad_token_id=0, eos_token_id=None)[0, 4:].tolist()
    return True, f"{n_main} main layers load (transformers {model.__class__.__name__}) and generate {new} greedy after [1, 2, 3, 4]"


def report_lines(report: LayoutReport) -> list[str]:
    ids = f"{report.n_main}..{report.n_main + report.depth - 1}" if report.depth else "none"
    lines = [f"{report.folder}: {report.family}, {report.n_main} main layers, num_nextn_predict_layers={report.depth} (MTP layer ids {ids})",
             f"target-only completeness: {'PASS' if report.target_ok else 'FAIL'} ({report.target_detail})",
             f"MTP completeness: {'PASS' if report.mtp_ok else 'FAIL'}" + ("" if report.mtp_ok else f" ({report.first_mtp_problem})"),
             f"fusion order: {report.fusion_order or 'unknown'} — {report.fusion_source}"]
    for layer in report.layers:
        line = f"MTP layer {layer.layer}: {layer.present}/{layer.expected} keys"
        if layer.missing:
            line += "; missing " + ", ".join(layer.missing[:8]) + (f" (+{len(layer.missing) - 8})" if len(layer.missing) > 8 else "")
        lines.append(line)
        lines += [f"MTP layer {layer.layer}: {problem}" for problem in layer.misshaped]
    lines += [f"dtype anomaly: {anomaly}" for anomaly in report.dtype_anomalies]
    return lines


def check_main(folder: str) -> int:
    """`lab-export --check DIR`: print both gates and the details; 1 when a gate fails, else 0."""
    report = inspect_layout(Path(folder))
    print("\n".join(report_lines(report)))
    return 0 if report.mtp_ok and report.target_ok else 1

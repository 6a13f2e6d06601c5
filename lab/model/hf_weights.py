"""What a Hugging Face folder's weight files hold, and whether transformers loaded every weight of it.

Nothing random, nothing cast quietly: a folder is read only when

- no tensor is stored quantised (fp8, int8/uint8, packed int4): transformers would cast such a tensor
  into a float parameter without its scales, so it is refused naming the key and its dtype;
- no tensor holds NaN or inf (the weight check of lab/model/weight_check.py, file by file, one tensor at a time);
- transformers reports no weight missing (it would be freshly initialised), unexpected, mis-shaped
  or failing conversion; the caller names the keys it expects to be left over (the MTP layers,
  which their own loader reads and checks the same way);
- a float cast (bfloat16 on disk into a float32 model) is said in one stderr line.

The table and the dtypes are read from the safetensors headers; the values are read once more than transformers reads them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from lab.errors import ConfigError, require
from lab.model.weight_check import check_weight_file

# safetensors dtype codes → torch dtype names
SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "F8_E4M3": "float8_e4m3fn",
                      "F8_E5M2": "float8_e5m2", "I8": "int8", "U8": "uint8", "I16": "int16", "I32": "int32", "I64": "int64", "BOOL": "bool"}
# Codes of quantised storage: fp8 / fp4 / int8 and the packed int4 codes (GPTQ and AWQ keep int4 in int32 `qweight`s).
QUANTISED_CODES = {"F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2", "I8", "U8", "I4", "U4"}
PACKED_WEIGHT_SUFFIXES = ("qweight", "qzeros")  # int32 tensors that hold int4 weights
FLOAT_CODES = {"F64": 64, "F32": 32, "F16": 16, "BF16": 16}  # bits
LOSSLESS_UPCASTS = {("BF16", torch.float32), ("F16", torch.float32)}  # every value of the stored dtype is exact in the model's


@dataclass
class TensorInfo:
    shape: tuple[int, ...]
    code: str  # the safetensors dtype code (F32, BF16, F8_E4M3, I8, …)
    file: str

    @property
    def dtype_name(self) -> str:
        return SAFETENSORS_DTYPES.get(self.code, self.code.lower())


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
    """Every key's shape and dtype code, from the safetensors headers. A key the index names but its shard lacks is left out."""
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
                    table[key] = TensorInfo(tuple(part.get_shape()), part.get_dtype(), name)
    return table


def is_quantised(key: str, info: TensorInfo) -> bool:
    return info.code in QUANTISED_CODES or (info.code in ("I32", "U32") and key.endswith(PACKED_WEIGHT_SUFFIXES))


def check_not_quantised(folder: Path, table: dict[str, TensorInfo]) -> None:
    """Refuse the first quantised tensor, naming it, its dtype and whether a scale sits beside it."""
    quantised = sorted(key for key, info in table.items() if is_quantised(key, info))
    if not quantised:
        return
    key = quantised[0]
    module = key.rsplit(".", 1)[0] + "."
    scales = sorted(other for other in table if other.startswith(module) and "scale" in other.rsplit(".", 1)[-1])
    beside = f"with {scales[0]} beside it" if scales else "with no scale beside it"
    more = f" ({len(quantised) - 1} more quantised tensors)" if len(quantised) > 1 else ""
    raise ConfigError(key, f"is stored as {table[key].dtype_name} {beside}{more}: quantised weights would be cast to float without "
                           f"their scales; give a dequantised (float) copy of {folder} (the tensor is in {table[key].file})")


def say_float_casts(folder: Path, table: dict[str, TensorInfo], dtype: torch.dtype) -> None:
    """One stderr line when the stored float dtypes differ from the model's (lossless or not, it is said)."""
    stored = sorted({info.code for info in table.values() if info.code in FLOAT_CODES})
    want = str(dtype).removeprefix("torch.")
    cast = [code for code in stored if SAFETENSORS_DTYPES[code] != want]
    if not cast:
        return
    lossless = all((code, dtype) in LOSSLESS_UPCASTS for code in cast)
    names = ", ".join(SAFETENSORS_DTYPES[code] for code in cast)
    print(f"note: {folder} stores {names} weights, loaded as {want} ({'a lossless upcast' if lossless else 'rounded: model.dtype asks for it'})",
          file=sys.stderr)


def audit_folder(folder: Path, dtype: torch.dtype, field: str = "model.path") -> dict[str, TensorInfo]:
    """The folder's tensor table, after the quantised refusal, the weight check of every value (refused naming `field`)
    and the cast note ({} for a folder without safetensors files, whose weights only transformers' load report checks)."""
    table = check_folder_weights(folder, field)
    say_float_casts(folder, table, dtype)
    return table


def has_weight_files(folder: Path) -> bool:
    return any((folder / name).is_file() for name in ("model.safetensors", "model.safetensors.index.json"))


def check_folder_weights(folder: Path, field: str) -> dict[str, TensorInfo]:
    """The weight check of every safetensors file of the folder (the MTP layers' too: their loader reads the same files);
    its tensor table ({} for a folder without safetensors files)."""
    if not has_weight_files(folder):
        return {}
    table = tensor_table(folder)
    check_not_quantised(folder, table)  # from the headers first: torch cannot even read some quantised codes (F4, I4)
    for name in sorted({info.file for info in table.values()}):
        check_weight_file(folder / name, field)
    return table


def first_keys(keys, limit: int = 3) -> str:
    keys = sorted(str(key) for key in keys)
    return ", ".join(keys[:limit]) + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def load_report_problem(info: dict, left_over=lambda key: False) -> str | None:
    """One line naming what transformers' load report lists (None: every weight loaded, nothing left over).
    `info` is from_pretrained's loading info; `left_over(key)` says which unexpected keys another loader reads."""
    missing = info.get("missing_keys") or ()
    unexpected = [key for key in info.get("unexpected_keys") or () if not left_over(key)]
    mismatched = [item[0] if isinstance(item, tuple) else item for item in info.get("mismatched_keys") or ()]
    errors = list(info.get("error_msgs") or ()) + list((info.get("conversion_errors") or {}).values())
    for what, keys in (("missing (would be freshly initialised)", missing), ("mis-shaped", mismatched), ("unexpected", unexpected)):
        if keys:
            return f"transformers reports {len(keys)} weight(s) {what}: {first_keys(keys)}"
    if errors:
        return f"transformers could not load it: {str(errors[0]).splitlines()[0][:200]}"
    return None


def mtp_layer_keys(config):
    """The predicate of keys in MTP layers N..N+D−1 (`model.layers.{i}.`), which the MTP loader reads and checks."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_main, depth = text.num_hidden_layers, getattr(text, "num_mtp_layers", None) or 0
    prefixes = tuple(f"model.layers.{i}." for i in range(n_main, n_main + depth))
    return lambda key: bool(prefixes) and key.startswith(prefixes)


def load_checked(model_class, folder: Path, left_over=lambda key: False, **options):
    """`model_class.from_pretrained(folder)` refused in one line unless transformers loaded every weight."""
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # its report table is replaced by the one line below, never silenced without it
    try:
        model, info = model_class.from_pretrained(folder, local_files_only=True, output_loading_info=True,
                                                    ignore_mismatched_sizes=True, **options)  # reported below, by key
    except (RuntimeError, ValueError, KeyError) as error:  # failed conversions raise
        raise ConfigError("model.path", f"transformers cannot load {folder}: {str(error).splitlines()[0][:200]}") from None
    finally:
        transformers_logging.set_verbosity(verbosity)
    problem = load_report_problem(info, left_over)
    require(problem is None, "model.path", f"{folder}: {problem}")
    return model

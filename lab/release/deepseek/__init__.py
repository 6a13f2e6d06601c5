"""The DeepSeek MTP layout as a `ReleaseLayout`: `lab-export --format deepseek`, `lab-export --check DIR`,
`lab-generate DIR` and `init_from=hf:DIR` (docs/releases.md)."""

from __future__ import annotations

from pathlib import Path

from lab.errors import require
from lab.model.heads import head_class
from lab.release.deepseek.check import check_main
from lab.release.deepseek.export import export_deepseek
from lab.release.deepseek.load import deepseek_head, is_deepseek_folder, load_deepseek_folder
from lab.release.layout import InitFromReader, LoadedFolder, ParentWeights, ReleaseLayout

HF_PREFIX = "hf:"  # init_from=hf:<folder>: a Hugging Face folder in the DeepSeek MTP layout


def has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file()


def load_for_generation(folder: Path) -> LoadedFolder:
    from lab.data.hf_tokenizer import HFTokenizer

    imported = load_deepseek_folder(folder)
    return LoadedFolder(imported.model, HFTokenizer(str(folder), "DIR"), imported.proposer_refusal)


def identity_file(folder: Path) -> Path:
    """The sharded index, or the one weight file."""
    index = folder / "model.safetensors.index.json"
    return index if index.is_file() else folder / "model.safetensors"


def parent_weights(folder: Path, model) -> ParentWeights:
    """A DeepSeek-layout folder as a parent: its main model, and its depths when this run's head drafts the same chain
    (the folder's eh_proj columns put in this head's declared order). A folder without its MTP layers gives a target only."""
    from lab.data.hf_tokenizer import HFTokenizer

    wants_depths = isinstance(model.head, head_class("deepseek"))
    imported = load_deepseek_folder(folder, head_order=model.head_cfg.fusion_order if wants_depths else "he")
    tokenizer = HFTokenizer(str(folder), "init_from").identity if has_tokenizer(folder) else {}
    state, vocab = imported.model.state_dict(), {"vocab_size": imported.model.trunk.cfg.vocab_size}
    if not wants_depths:
        return ParentWeights({key: value for key, value in state.items() if key.startswith("trunk.")}, vocab, tokenizer, None)
    require(imported.proposer_refusal is None, "init_from", imported.proposer_refusal or "")
    expected = deepseek_head(imported.report.depth, model.head_cfg.fusion_order)
    for key in ("depth", "block", "hidden_input") + (("chain_state",) if imported.report.depth > 1 else ()):
        require(getattr(model.head_cfg, key, None) == expected[key], f"head.{key}",
                f"the folder's depths compute with head.{key}={expected[key]} (what transformers runs); this run has {getattr(model.head_cfg, key, None)}")
    return ParentWeights(state, vocab, tokenizer, "deepseek")


LAYOUT = ReleaseLayout("deepseek", "a head=deepseek run on a model=hf family with MTP layers, depths as model.layers.{N+d-1}",
                       export_deepseek, recognizes=is_deepseek_folder, load=load_for_generation, check=check_main,
                       init_from=InitFromReader(kind="hf", read=parent_weights, identity_file=identity_file, prefix=HF_PREFIX))

"""Load a DeepSeek-layout folder into the harness under the alias contract of docs/releases.md.

`load_deepseek_folder(DIR)` is what `lab-generate DIR`, `init_from=hf:DIR` and `lab-export --check DIR` run:

- the main model is transformers' own, read from DIR (`model=hf model.path=DIR`) with every weight accounted
  for (lab/model/hf_weights.py: nothing missing, unexpected or mis-shaped, nothing quantised);
- the MTP layers are read by transformers' own MTP loader (`MtpModel.from_pretrained`, what
  `generate(use_mtp=True)` runs): per-expert and fused expert tensors are converted to the installed
  transformers' layout, each layer is built as the kind the family builds (deepseek_v3's are MoE), and any
  weight it reports missing, unexpected, mis-shaped or unconvertible fails MTP completeness;
- depth d is a `head=deepseek` depth module whose block is that same decoder layer (`head.block=native`), fed
  the post-final-norm state and passing on the normed state (what transformers runs); eh_proj's columns are put
  in the head's declared order from the order transformers' MtpLayer runs (`mtp_hidden_states_first`);
- `embed_tokens`, `shared_head.head` and `shared_head.norm` are not loaded anywhere: the depths use the trunk's
  own embedding, lm_head and final norm (the same Parameter objects); a folder whose copies differ fails MTP completeness.

A folder that fails MTP completeness still loads as a target (head=ntp); `proposer_refusal` says why it cannot draft.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from lab.release.deepseek.fusion_order import projection_in_order, runtime_fusion_order
from lab.release.deepseek.layout import LayoutReport, inspect_layout
from lab.model.mtp_families import family_refusal
from lab.model.hf_weights import load_report_problem, tensor_table
from lab.model.mtp import build_model

# (the folder's key under model.layers.{L}., the trunk part it must equal)
ALIASED = (("embed_tokens.weight", "embedding", lambda trunk: trunk.embed.weight),
           ("shared_head.head.weight", "lm_head", lambda trunk: trunk.unembedding))


class MTPLoadProblem(Exception):
    """Why transformers' MTP loader or the harness's depths do not take the folder's MTP layers (one line)."""


@dataclass
class ImportedFolder:
    model: object  # MTPModel in eval mode
    report: LayoutReport
    fusion_order: str | None  # the order transformers' MtpLayer runs for the folder's family
    mtp_problem: str | None  # why MTP completeness fails (None: a complete MTP release)
    proposer_refusal: str | None  # why it cannot draft (None: a complete MTP release)

    @property
    def fusion_line(self) -> str:
        flag = self.fusion_order == "he"
        return f"{self.fusion_order} — what transformers' MtpLayer concatenates for {self.report.family} (mtp_hidden_states_first={flag})"


def is_deepseek_folder(path: Path) -> bool:
    """A Hugging Face folder whose config declares MTP layers (lab releases and Medusa folders do not)."""
    import json

    config = path / "config.json"
    if not (path.is_dir() and config.is_file()):
        return False
    try:
        values = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False  # not a Hugging Face folder this layout can read: the others (or lab-generate's own line) decide
    if not isinstance(values, dict):
        return False
    values = values.get("text_config", values)
    return "num_nextn_predict_layers" in values or "num_mtp_layers" in values


def deepseek_head(depth: int, fusion_order: str = "he") -> dict:
    """The head config that computes what transformers' MTP decoding computes."""
    return {"name": "deepseek", "depth": depth, "block": "native", "hidden_input": "post_norm", "chain_state": "normed",
            "fusion_order": fusion_order, "compute_match": "none"}


def static_problem(report: LayoutReport) -> str | None:
    """What config.json and the headers already rule out: a family the harness does not read, no MTP layer."""
    return family_refusal(report.family) or report.first_mtp_problem or None


def load_deepseek_folder(folder: str | Path, *, head_order: str = "he", dtype: str = "float32",
                         attn_implementation: str = "sdpa") -> ImportedFolder:
    """The folder as an MTPModel; `head_order`: the loaded
    head's fusion order. A damaged main model is a ConfigError."""
    folder = Path(folder)
    report = inspect_layout(folder)
    model_cfg = {"name": "hf", "path": str(folder), "dtype": dtype, "attn_implementation": attn_implementation}
    problem = static_problem(report)
    if problem is None:
        model = build_model(model_cfg, deepseek_head(report.depth, head_order))
        order = runtime_fusion_order(model.trunk.hf.config)
        try:
            fill_depths(model, folder, report, order)
            return ImportedFolder(model.eval(), report, order, None, None)
        except MTPLoadProblem as error:
            problem = str(error)
    model = build_model(model_cfg, {"name": "ntp", "compute_match": "none"})
    refusal = f"{folder} is not a complete MTP release ({problem}); it loads as a target only"
    return ImportedFolder(model.eval(), report, runtime_fusion_order(model.trunk.hf.config), problem, refusal)


@functools.cache
def checked_mtp_model_class():
    """transformers' MtpModel whose load report is the harness's verdict: anything it lists (missing, unexpected, mis-shaped,
    unconvertible) raises MTPLoadProblem before transformers would only warn. Registered under its own name with
    MtpModel's key conversions (transformers' API for a model class defined outside it)."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
    from transformers.modeling_layers import MtpModel

    class CheckedMtpModel(MtpModel):
        def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
            super()._adjust_missing_and_unexpected_keys(loading_info)
            problem = load_report_problem(vars(loading_info))
            if problem is not None:
                raise MTPLoadProblem(problem)

    register_checkpoint_conversion_mapping(CheckedMtpModel.__name__, get_checkpoint_conversion_mapping(MtpModel.__name__), overwrite=True)
    return CheckedMtpModel


def transformers_mtp_layers(hf_model, report: LayoutReport):
    """transformers' own MtpModel of the folder (what generate(use_mtp=True) drafts with); MTPLoadProblem naming the folder's
    keys when its load report lists anything."""
    from transformers.utils import logging as transformers_logging

    # transformers finds MTP weights by the patterns the main model ignores (`model\.layers\.61.*` for the released
    # DeepSeek-V3, 61 main layers): the folder's own layer ids N..N+D−1 are those patterns here.
    hf_model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{layer}\..*" for layer in report.mtp_layer_ids]
    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # its report is the MTPLoadProblem line
    try:
        return checked_mtp_model_class().from_pretrained(hf_model)
    except MTPLoadProblem as problem:
        raise MTPLoadProblem(on_disk_names(str(problem), report.n_main)) from None
    except (RuntimeError, ValueError, KeyError) as error:
        raise MTPLoadProblem(f"transformers' MTP loader fails: {str(error).splitlines()[0][:200]}") from None
    finally:
        transformers_logging.set_verbosity(verbosity)


def on_disk_names(line: str, n_main: int) -> str:
    """MtpModel's key names (`layers.{k}.mtp_block.X`, `layers.{k}.post_norm`) as the folder's (`model.layers.{N+k}.X`, …)."""
    import re

    line = re.sub(r"(?<![\w.])layers\.(\d+)\.post_norm\.", lambda m: f"model.layers.{n_main + int(m.group(1))}.shared_head.norm.", line)
    line = re.sub(r"(?<![\w.])layers\.(\d+)\.mtp_block\.", lambda m: f"model.layers.{n_main + int(m.group(1))}.", line)
    return re.sub(r"(?<![\w.])layers\.(\d+)\.", lambda m: f"model.layers.{n_main + int(m.group(1))}.", line)


def fill_depths(model, folder: Path, report: LayoutReport, order: str) -> None:
    """Depth d ← transformers' MTP layer d − 1 (the aliased parts checked, never copied); MTPLoadProblem when one does not fit."""
    if report.declared_order not in (None, order):
        raise MTPLoadProblem(f"config.json declares mtp_fusion_order={report.declared_order}, but transformers' MtpLayer for "
                             f"{report.family} runs {order}: drafts would differ between runtimes")
    head, trunk = model.head, model.trunk
    mtp = transformers_mtp_layers(trunk.hf, report)
    check_aliased_copies(folder, report, trunk)
    for d, layer in enumerate(mtp.layers, start=1):
        module, name = head.module_at(d), f"model.layers.{report.n_main + d - 1}"
        if layer.post_norm is not None and not torch.equal(layer.post_norm.weight.to(trunk.final_norm.weight.dtype), trunk.final_norm.weight.detach()):
            raise MTPLoadProblem(f"{name}.shared_head.norm.weight differs from the trunk's final norm; the harness's depths use the "
                                 "trunk's own (an alias: docs/releases.md, Aliases agree), so this folder cannot load as is")
        load_block(module.block, layer.mtp_block.state_dict(), name)
        with torch.no_grad():
            module.embed_norm.weight.copy_(layer.enorm.weight)
            module.hidden_norm.weight.copy_(layer.hnorm.weight)
            module.proj.weight.copy_(projection_in_order(layer.eh_proj.weight, order, head.cfg.fusion_order))


def load_block(block, state: dict[str, torch.Tensor], name: str) -> None:
    """The family's MTP decoder layer into the depth's native block: same keys, same shapes, or one line naming the first that differs."""
    own = block.state_dict()
    differ = sorted(set(own) ^ set(state)) or sorted(key for key in own if own[key].shape != state[key].shape)
    if differ:
        raise MTPLoadProblem(f"{name}.{differ[0]} does not fit the harness's depth block ({len(differ)} key(s) differ: "
                             "missing, unexpected or mis-shaped against the family's MTP layer)")
    block.load_state_dict(state, strict=True)


def check_aliased_copies(folder: Path, report: LayoutReport, trunk) -> None:
    """The folder's embed_tokens / shared_head.head copies (transformers ignores them) must equal the trunk's."""
    from safetensors import safe_open

    table = tensor_table(folder)
    for layer in report.mtp_layer_ids:
        for name, what, part in ALIASED:
            key = f"model.layers.{layer}.{name}"
            if key not in table:
                continue
            with safe_open(folder / table[key].file, "pt") as handle:
                copy = handle.get_tensor(key)
            own = part(trunk)
            if copy.shape != own.shape or not torch.equal(copy.to(own.dtype), own.detach()):
                raise MTPLoadProblem(f"{key} differs from the trunk's {what}; the harness's depths use the trunk's own (an alias: "
                                     "docs/releases.md, Aliases agree), so this folder cannot load as is")

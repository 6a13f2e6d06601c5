"""Load a DeepSeek-layout folder into the harness under the alias contract of M7.6 §0x07B.

`load_deepseek_folder(DIR)` (what `lab-generate DIR` and `init_from=hf:DIR` use):

- the main model is transformers' own, read from DIR (`model=hf model.path=DIR`);
- depth d is a `head=deepseek` depth module built as the family's decoder layer (`head.block=native`)
  fed the post-final-norm state and passing on the normed state (what transformers runs), filled from
  `model.layers.{N+d-1}`: enorm, hnorm, the block's keys, and eh_proj with its columns put in the head's
  declared order — the folder's order is a declaration (`mtp_fusion_order`, transformers' flag, or the
  family's loaders), never guessed from shapes;
- `embed_tokens`, `shared_head.head` and `shared_head.norm` are not loaded anywhere: the depths use the trunk's
  own embedding, lm_head and final norm (the same Parameter objects); a folder whose copies differ from the
  trunk's is refused, since aliasing them would change what it computes;
- layer ids N..N+D−1 come from `num_nextn_predict_layers` and must all be there (MTP completeness). A folder
  that fails it still loads as a target (head=ntp); `proposer_refusal` says why it cannot draft.

Dense, decoded weights only: per-expert or fp8 tensors of an original release are the checkpoint adapter's job
(the loader names the first key that does not fit).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

from lab.checkpoint.deepseek_layout import LayoutReport, inspect_layout, tensor_table
from lab.checkpoint.export_deepseek import projection_in_order
from lab.errors import ConfigError, require

# (the folder's key under model.layers.{L}., the trunk part it must equal)
ALIASED = (("embed_tokens.weight", "embedding", lambda trunk: trunk.embed.weight),
           ("shared_head.head.weight", "lm_head", lambda trunk: trunk.unembedding),
           ("shared_head.norm.weight", "final norm", lambda trunk: trunk.final_norm.weight))


@dataclass
class ImportedFolder:
    model: object  # MTPModel in eval mode
    report: LayoutReport
    fusion_order: str | None  # the folder's declared order
    proposer_refusal: str | None  # why it cannot draft (None: a complete MTP release)


def is_deepseek_folder(path: Path) -> bool:
    """A Hugging Face folder whose config declares MTP layers (lab releases and Medusa folders do not)."""
    import json

    config = path / "config.json"
    if not (path.is_dir() and config.is_file()):
        return False
    values = json.loads(config.read_text())
    values = values.get("text_config", values)
    return "num_nextn_predict_layers" in values or "num_mtp_layers" in values


@contextlib.contextmanager
def quiet_transformers():
    """transformers lists the MTP keys as unexpected when loading the main model: the gates say it in one line."""
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(verbosity)


def deepseek_head(depth: int, fusion_order: str = "he") -> dict:
    """The head config that computes what transformers' MTP decoding computes."""
    return {"name": "deepseek", "depth": depth, "block": "native", "hidden_input": "post_norm", "chain_state": "normed",
            "fusion_order": fusion_order, "compute_match": "none"}


def load_deepseek_folder(folder: str | Path, *, fusion_order: str | None = None, head_order: str = "he",
                         dtype: str = "float32", attn_implementation: str = "sdpa") -> ImportedFolder:
    """The folder as an MTPModel; `fusion_order` overrides the folder's declaration; `head_order`: the loaded head's."""
    from lab.model.mtp import build_model

    folder = Path(folder)
    report = inspect_layout(folder, load_target=False)
    order = fusion_order or report.fusion_order
    model_cfg = {"name": "hf", "path": str(folder), "dtype": dtype, "attn_implementation": attn_implementation}
    if not report.mtp_ok:
        with quiet_transformers():
            model = build_model(model_cfg, {"name": "ntp", "compute_match": "none"})
        refusal = f"{folder} is not a complete MTP release ({report.first_mtp_problem}); it loads as a target only"
        return ImportedFolder(model.eval(), report, order, refusal)
    require(order in ("he", "eh"), "mtp_fusion_order",
            f"{folder} does not declare its fusion order ({report.fusion_source}); declare he ([hidden, embedding]) or eh ([embedding, hidden]) — shapes cannot tell")
    with quiet_transformers():
        model = build_model(model_cfg, deepseek_head(report.depth, head_order))
    fill_depths(model, folder, report, order)
    return ImportedFolder(model.eval(), report, order, None)


def fill_depths(model, folder: Path, report: LayoutReport, order: str) -> None:
    """Copy MTP layers N..N+D−1 into the depth modules (the aliased parts checked, never copied)."""
    from safetensors import safe_open

    files = {key: info.file for key, info in tensor_table(folder).items()}

    def read(key: str) -> torch.Tensor:
        with safe_open(folder / files[key], "pt") as handle:
            return handle.get_tensor(key)

    head, trunk = model.head, model.trunk
    for d, layer in enumerate(report.mtp_layer_ids, start=1):
        prefix = f"model.layers.{layer}."
        for name, what, part in ALIASED:
            own = part(trunk)
            require(torch.equal(read(prefix + name).to(own.dtype), own.detach()), prefix + name,
                    f"differs from the trunk's {what}; the harness's depths use the trunk's own (an alias, M7.6 §0x07B), so this folder cannot load as is")
        module = head.module_at(d)
        block_keys = [key for key in files if key.startswith(prefix) and key[len(prefix):].split(".")[0] not in
                      ("enorm", "hnorm", "eh_proj", "shared_head", "embed_tokens")]
        block_state = {key[len(prefix):]: read(key) for key in block_keys}
        try:
            module.block.load_state_dict(block_state, strict=True)
        except RuntimeError as error:
            raise ConfigError(prefix + "*", f"the block does not fit the family's decoder layer ({str(error).splitlines()[0][:200]})") from None
        with torch.no_grad():
            module.embed_norm.weight.copy_(read(prefix + "enorm.weight"))
            module.hidden_norm.weight.copy_(read(prefix + "hnorm.weight"))
            module.proj.weight.copy_(projection_in_order(read(prefix + "eh_proj.weight"), order, head.cfg.fusion_order))

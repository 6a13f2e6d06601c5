"""`lab-export CKPT --format deepseek --out DIR`: a DeepSeek-chain run on a model=hf trunk in the released MTP layout.

The trunk's own weights and config (LoRA merged), plus depth d (1..D) as `model.layers.{N+d-1}.*`:

    enorm        ← the depth's embed_norm          hnorm             ← its hidden_norm
    eh_proj      ← its proj, columns in the order transformers' MtpLayer runs for the family (`mtp_hidden_states_first`:
                   [hidden, embedding], else [embedding, hidden]); a head trained in the other order has its two column
                   blocks swapped — never its inputs reinterpreted, never a flag written that the runtime ignores
    the block    ← its native decoder layer, built as the family's MTP layer kind (head.block=native)
    shared_head.norm / shared_head.head / embed_tokens ← the trunk's final norm, lm_head and embedding (copies on
                   disk of what the harness aliases)

config.json gets `num_nextn_predict_layers` = D and `mtp_fusion_order` = the runtime's order (the declaration the
importer checks). Shards with an index, the tokenizer beside them, files with the user's umask; written to a
temporary folder, read back by the very loader `--check` runs (it must pass both gates), then renamed.

What the family runs must be what the heads learned, else the export refuses in one line: the family must be a
round-trip family of the table (lab/model/mtp_families.py); transformers feeds MTP layer N the
post-final-norm state (head.hidden_input=post_norm) and, for D ≥ 2, passes each depth's output on after its
shared_head.norm (head.chain_state=normed); neither is a weight conversion.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from lab.errors import require
from lab.model.heads import head_class
from lab.release.deepseek.fusion_order import projection_in_order, runtime_fusion_order
from lab.release.hf_folder import honour_umask_in, staged_folder, transformers_tokenizer
from lab.model.mtp_families import MTP_FAMILIES, family_refusal

SHARD_SIZE = "2GB"


def family_export_refusal(config) -> str | None:
    """Why `--format deepseek` cannot write this family's MTP layers (None: a round-trip family of the table)."""
    family = config.model_type
    if family not in MTP_FAMILIES and not hasattr(config, "num_mtp_layers"):
        return (f"model_type '{family}' declares no MTP layers in transformers (no num_nextn_predict_layers); "
                f"families that do: {', '.join(sorted(MTP_FAMILIES))}")
    return family_refusal(family)


def check_exportable(model) -> None:
    head_cfg = model.head_cfg
    require(isinstance(model.head, head_class("deepseek")), "--format", f"deepseek exports head=deepseek runs; this checkpoint's head is '{head_cfg.name}'")
    require(model.trunk.transformers_model is not None, "--format", "deepseek needs a model=hf trunk of a family with MTP layers; this run trains the harness's GPT")
    refusal = family_export_refusal(model.trunk.hf.config.get_text_config())
    require(refusal is None, "--format", refusal or "")
    require(getattr(head_cfg, "block", "lab") == "native", "head.block",
            "the depth blocks are the harness's own; the layout stores the family's decoder layer (train with head.block=native)")
    require(head_cfg.hidden_input == "post_norm", "head.hidden_input",
            "transformers feeds MTP layer N the post-final-norm state; these heads were trained on pre_norm (no weight change converts it): train with head.hidden_input=post_norm")
    require(head_cfg.depth == 1 or head_cfg.chain_state == "normed", "head.chain_state",
            f"transformers feeds depth d+1 depth d's output after its shared_head.norm; these {head_cfg.depth} depths pass the block output on: "
            "train with head.chain_state=normed (or depth 1)")


def trunk_state(model) -> tuple[dict[str, torch.Tensor], object]:
    """(state dict, config) of the transformers model the export starts from (LoRA merged into a copy)."""
    hf = model.trunk.hf
    if "peft_model" in model.trunk.__dict__:
        from lab.nn.lora import merged_copy

        hf = merged_copy(model.trunk)
    return {key: value.detach().clone().contiguous() for key, value in hf.state_dict().items()}, hf


def mtp_layer_state(model, n_main: int) -> dict[str, torch.Tensor]:
    """The keys of MTP layers N..N+D−1 from the head (each depth's module; a shared module is written at every depth)."""
    head, trunk = model.head, model.trunk
    state = {}
    for d in range(1, head.depth + 1):
        module, prefix = head.module_at(d), f"model.layers.{n_main + d - 1}."
        state |= {prefix + key: value for key, value in module.block.state_dict().items()}
        state[prefix + "enorm.weight"] = module.embed_norm.weight
        state[prefix + "hnorm.weight"] = module.hidden_norm.weight
        state[prefix + "eh_proj.weight"] = projection_in_order(module.proj.weight, head.cfg.fusion_order, runtime_fusion_order(trunk.hf.config))
        state[prefix + "shared_head.norm.weight"] = trunk.final_norm.weight
        state[prefix + "shared_head.head.weight"] = trunk.unembedding
        state[prefix + "embed_tokens.weight"] = trunk.embed.weight
    return {key: value.detach().clone().contiguous() for key, value in state.items()}  # own storage: no shared tensors on disk


def export_deepseek(checkpoint: dict, out: Path, model) -> str:
    """`lab-export --format deepseek`: `out` from a checkpoint loaded as `model`, with the run's tokenizer; the verdict's lines."""
    from lab.release.deepseek.check import report_lines

    check_exportable(model)
    verdict = write_deepseek_folder(model, out, transformers_tokenizer(checkpoint.get("mtp_tokenizer"), checkpoint["mtp_manifest"]))
    return "\n".join(report_lines(verdict.report, None, verdict.mtp_problem, verdict.fusion_line))


def write_deepseek_folder(model, out: Path, tokenizer=None):
    """Write `out` (all or nothing) from `model`; returns the verdict of the loader `--check` runs on what was written."""
    from huggingface_hub import save_torch_state_dict

    from lab.release.deepseek.load import load_deepseek_folder

    check_exportable(model)
    state, hf = trunk_state(model)
    n_main = hf.config.get_text_config().num_hidden_layers
    state |= mtp_layer_state(model, n_main)
    with staged_folder(out) as tmp:
        hf.config.save_pretrained(tmp)
        config = json.loads((tmp / "config.json").read_text())
        config.pop("num_mtp_layers", None)
        config |= {"num_nextn_predict_layers": model.head.depth, "mtp_fusion_order": runtime_fusion_order(hf.config)}
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        save_torch_state_dict(state, tmp, max_shard_size=SHARD_SIZE)
        if not (tmp / "model.safetensors.index.json").is_file():  # one shard: the index is written anyway (the layout's)
            write_single_shard_index(tmp, state)
        honour_umask_in(tmp)  # safetensors writes its files 0600
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        verdict = load_deepseek_folder(tmp)
        if verdict.mtp_problem is not None:
            raise RuntimeError(f"export: the written folder fails its own MTP gate: {verdict.mtp_problem}")
    verdict.report.folder = out
    return verdict


def write_single_shard_index(folder: Path, state: dict[str, torch.Tensor]) -> None:
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": {key: "model-00001-of-00001.safetensors" for key in sorted(state)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))

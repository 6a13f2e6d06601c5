"""Damaged releases: every case either loads whole (both gates PASS, every loader accepts it) or is refused in one
line by `lab-export --check` and by every loader alike — never loaded with a weight left random or cast quietly.

Loaders: `lab-generate DIR --speculative` (in process), `init_from=hf:DIR` (load_parent_weights) and the model=hf trunk
itself (`model.path=DIR`, what a run started from the folder builds). Folders are tiny DeepSeek-V3 releases written by
transformers plus the MTP layers in the released layout (tests/deepseek_fixtures.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from lab.release.deepseek.check import check_main
from lab.release.deepseek.load import deepseek_head, load_deepseek_folder
from lab.release.init_from import load_parent_weights
from lab.model.mtp_families import MTP_FAMILIES, family_refusal
from lab.decode.cli import main as lab_generate
from lab.errors import ConfigError
from lab.model import build_model
from tests.deepseek_fixtures import DEEPSEEK, N_MAIN, write_deepseek_release

pytestmark = pytest.mark.usefixtures("single_thread")

D = DEEPSEEK["hidden_size"]
ALL_DENSE = {"first_k_dense_replace": N_MAIN + 1}  # every main layer dense; transformers' MTP layer stays MoE


def scaled(key: str, factor: float):
    def edit(state):
        state[key] = state[key] * factor
    return edit


def narrowed(key: str):
    def edit(state):
        state[key] = state[key][..., : state[key].shape[-1] // 2].contiguous()  # half the input columns
    return edit


def all_bfloat16(state):
    state.update({key: value.to(torch.bfloat16) for key, value in state.items()})


# id -> (write_deepseek_release options, verdict: pass | target | mtp, what the one line must name)
CASES = {
    "complete": ({}, "pass", None),
    "per_expert_layout": ({"experts": "per_expert"}, "pass", None),
    "all_dense_trunk_moe_mtp": ({"config_overrides": ALL_DENSE}, "pass", None),
    "bfloat16_upcast": ({"edit": all_bfloat16}, "pass", None),
    "missing_main_weight": ({"drop": ("model.layers.0.self_attn.q_proj.weight",)}, "target",
                            "missing (would be freshly initialised): model.layers.0.self_attn.q_proj.weight"),
    "misshaped_main_weight": ({"edit": narrowed("model.layers.0.mlp.up_proj.weight")}, "target", "mis-shaped: model.layers.0.mlp.up_proj.weight"),
    "stray_layer": ({"extra": {f"model.layers.{N_MAIN + 1}.input_layernorm.weight": torch.ones(D)}}, "target",
                    f"unexpected: model.layers.{N_MAIN + 1}.input_layernorm.weight"),
    "fp8_eh_proj": ({"dtypes": {"model.layers.2.eh_proj.weight": torch.float8_e4m3fn}}, "target",
                    "model.layers.2.eh_proj.weight: is stored as float8_e4m3fn with no scale beside it"),
    "int8_block_weight": ({"dtypes": {"model.layers.1.self_attn.o_proj.weight": torch.int8}}, "target",
                          "model.layers.1.self_attn.o_proj.weight: is stored as int8 with no scale beside it"),
    "int8_with_its_scale": ({"dtypes": {"model.layers.2.self_attn.o_proj.weight": torch.int8},
                             "extra": {"model.layers.2.self_attn.o_proj.weight_scale": torch.ones(D)}}, "target",
                            "model.layers.2.self_attn.o_proj.weight: is stored as int8 with model.layers.2.self_attn.o_proj.weight_scale beside it"),
    "int4_packed_qweight": ({"extra": {"model.layers.1.self_attn.o_proj.qweight": torch.zeros(D // 8, D, dtype=torch.int32)}}, "target",
                            "model.layers.1.self_attn.o_proj.qweight: is stored as int32 with no scale beside it"),
    "missing_mtp_weight": ({"drop": ("model.layers.2.hnorm.weight",)}, "mtp", "missing (would be freshly initialised): model.layers.2.hnorm.weight"),
    "missing_mtp_layer": ({"drop_layers": (2,)}, "mtp", "MTP layer 2 (model.layers.2.*) is missing entirely"),
    "misshaped_mtp_weight": ({"edit": narrowed("model.layers.2.eh_proj.weight")}, "mtp", "mis-shaped: model.layers.2.eh_proj.weight"),
    "stray_mtp_weight": ({"extra": {"model.layers.2.extra_proj.weight": torch.ones(D, D)}}, "mtp", "unexpected: model.layers.2.extra_proj.weight"),
    "dense_mtp_after_dense_trunk": ({"config_overrides": ALL_DENSE, "mtp_kind": "trunk"}, "mtp",
                                    "missing (would be freshly initialised): model.layers.2.mlp.experts.down_proj"),
    "embedding_copy_differs": ({"edit": scaled("model.layers.2.embed_tokens.weight", 1.5)}, "mtp",
                               "model.layers.2.embed_tokens.weight differs from the trunk's embedding"),
    "shared_head_norm_differs": ({"edit": scaled("model.layers.2.shared_head.norm.weight", 1.5)}, "mtp",
                                 "model.layers.2.shared_head.norm.weight differs from the trunk's final norm"),
    "mtp_expert_missing": ({"experts": "per_expert", "drop": ("model.layers.2.mlp.experts.3.down_proj.weight",)}, "mtp",
                           "model.layers.2.mlp.experts.3.down_proj.weight is missing"),
    "mtp_expert_misshaped": ({"edit": narrowed("model.layers.2.mlp.experts.down_proj")}, "mtp", "mis-shaped: model.layers.2.mlp.experts.down_proj"),
    "declared_order_contradicts_runtime": ({"config_extra": {"mtp_fusion_order": "he"}}, "mtp",
                                           "config.json declares mtp_fusion_order=he, but transformers' MtpLayer for deepseek_v3 runs eh"),
}


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    """config overrides -> a head=deepseek depth-1 run's model on a complete folder of that config (the init_from child)."""
    children = {}

    def get(overrides: dict | None):
        key = tuple(sorted((overrides or {}).items()))
        if key not in children:
            folder = write_deepseek_release(tmp_path_factory.mktemp("child") / "release", config_overrides=overrides)
            children[key] = build_model({"name": "hf", "path": str(folder)}, deepseek_head(1))
        return children[key]

    return get


def speculative_generate(folder: Path, capsys) -> tuple[int, list[str]]:
    try:
        lab_generate([str(folder), "--prompt", "def f1(x):", "--max-new-tokens", "3", "--speculative"])
        code = 0
    except SystemExit as stop:
        code = stop.code
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("case", list(CASES))
def test_check_and_every_loader_agree_on_a_damaged_release(case, tmp_path, capsys, child):
    options, verdict, named = CASES[case]
    folder = write_deepseek_release(tmp_path / "release", **options)
    code = check_main(str(folder))
    lines = capsys.readouterr().out.strip().splitlines()
    target, mtp = lines[1], lines[2]
    generated, errors = speculative_generate(folder, capsys)
    parent_child = child(options.get("config_overrides"))
    if verdict == "pass":
        assert code == 0 and target.startswith("target-only completeness: PASS") and mtp.startswith("MTP completeness: PASS"), lines
        assert generated == 0, errors
        assert load_parent_weights(parent_child, f"hf:{folder}")["kind"] == "hf"
        return
    assert code == 1
    if verdict == "target":
        assert target.startswith("target-only completeness: FAIL (") and named in target and mtp.startswith("MTP completeness: not checked")
        problem = target.removeprefix("target-only completeness: FAIL (").removesuffix(")")
        assert generated == 2 and errors == [f"error: {problem}"]
        with pytest.raises(ConfigError) as refused:
            build_model({"name": "hf", "path": str(folder)}, {"name": "ntp"})  # a run with model.path=DIR
        assert str(refused.value) == problem
    else:
        assert target.startswith("target-only completeness: PASS") and mtp.startswith("MTP completeness: FAIL (") and named in mtp, lines
        problem = mtp.removeprefix("MTP completeness: FAIL (").removesuffix(")")
        assert generated == 2 and errors == [f"error: --speculative: {folder} is not a complete MTP release ({problem}); it loads as a target only"]
    with pytest.raises(ConfigError) as refused:
        load_parent_weights(parent_child, f"hf:{folder}")
    assert problem in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(("options", "experts"), [({}, "4 routed experts, grouped (mlp.experts.gate_up_proj [4, 32, 32])"),
                                                ({"experts": "per_expert"}, "4 routed experts, per expert (mlp.experts.{e}.*)"),
                                                ({"writer": "save_pretrained"}, "4 routed experts, per expert (mlp.experts.{e}.*)")])
def test_check_counts_the_experts_of_every_mtp_layer(options, experts, tmp_path, capsys):
    folder = write_deepseek_release(tmp_path / "release", depth=2, **options)
    assert check_main(str(folder)) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(", ", 1)[1] for line in lines[-2:]] == [experts, experts]
    assert [line.split(":")[0] for line in lines[-2:]] == [f"MTP layer {N_MAIN}", f"MTP layer {N_MAIN + 1}"]


def test_a_bfloat16_release_is_upcast_and_says_so(tmp_path, capsys):
    folder = write_deepseek_release(tmp_path / "release", edit=all_bfloat16)
    capsys.readouterr()
    imported = load_deepseek_folder(folder)
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert imported.mtp_problem is None and notes and set(notes) == {f"note: {folder} stores bfloat16 weights, loaded as float32 (a lossless upcast)"}


def test_per_expert_and_fused_layouts_import_the_same_weights(tmp_path):
    fused = load_deepseek_folder(write_deepseek_release(tmp_path / "fused", depth=2)).model.state_dict()
    split = load_deepseek_folder(write_deepseek_release(tmp_path / "split", depth=2, experts="per_expert")).model.state_dict()
    assert any(".mlp.experts.gate_up_proj" in key and key.startswith("head.") for key in fused)  # the depths' MoE weights too
    assert fused.keys() == split.keys() and all(torch.equal(fused[key], split[key]) for key in fused)


def test_the_depth_block_of_an_all_dense_trunk_is_the_moe_layer_transformers_builds():
    model = build_model({"name": "hf", "config": {"model_type": "deepseek_v3", **DEEPSEEK, **ALL_DENSE}}, deepseek_head(1))
    trunk_mlps = {type(layer.mlp).__name__ for layer in model.trunk.blocks}
    assert trunk_mlps == {"DeepseekV3MLP"} and type(model.head.module_at(1).block.mlp).__name__ == "DeepseekV3MoE"


def mtp_families_in_installed_transformers() -> set[str]:
    """Causal-LM model types whose configuration source declares MTP layers (num_mtp_layers / num_nextn_predict_layers)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    found = set()
    for source in Path(transformers.__file__).parent.glob("models/*/configuration_*.py"):
        text = source.read_text()
        if "num_mtp_layers" in text or "num_nextn_predict_layers" in text:
            found |= set(re.findall(r'model_type\s*=\s*"([\w-]+)"', text)) & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    return found


def test_the_family_table_covers_every_family_transformers_gives_mtp_layers():
    found = mtp_families_in_installed_transformers()
    assert {"deepseek_v3", "glm4_moe", "inkling_text", "bailing_hybrid", "mellum", "deepseek_v4", "nemotron_h"} <= found
    assert found == set(MTP_FAMILIES), found ^ set(MTP_FAMILIES)
    for family, entry in MTP_FAMILIES.items():
        refusal = family_refusal(family)
        assert (refusal is None) == entry.round_trip
        assert refusal is None or (refusal.startswith(f"model_type '{family}': ") and "\n" not in refusal)


@pytest.mark.parametrize("family", sorted(MTP_FAMILIES))
def test_the_export_follows_the_family_table(family):
    """What `--format deepseek` says of each family's (default) config: nothing for a round-trip family, else the table's line."""
    from transformers import AutoConfig

    from lab.release.deepseek.export import family_export_refusal

    config = AutoConfig.for_model(family).get_text_config()
    assert family_export_refusal(config) == family_refusal(family)
    assert family_export_refusal(AutoConfig.for_model("llama")).startswith("model_type 'llama' declares no MTP layers in transformers")


SARVAM_MOE = dict(model_type="sarvam_moe", vocab_size=300, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2, num_shared_experts=1,
                  first_k_dense_replace=1, max_position_embeddings=128, tie_word_embeddings=False, num_nextn_predict_layers=1)


def test_a_refused_family_is_refused_in_one_line_by_export_check_and_loaders(tmp_path, capsys):
    from lab.release.deepseek.export import write_deepseek_folder

    torch.manual_seed(0)
    model = build_model({"name": "hf", "config": SARVAM_MOE}, deepseek_head(1))
    with pytest.raises(ConfigError) as refused:
        write_deepseek_folder(model, tmp_path / "export")
    assert str(refused.value) == f"--format: {family_refusal('sarvam_moe')}" and not (tmp_path / "export").exists()
    folder = tmp_path / "release"
    model.trunk.hf.save_pretrained(folder)
    code = check_main(str(folder))
    lines = capsys.readouterr().out.strip().splitlines()
    assert code == 1 and lines[2] == f"MTP completeness: FAIL ({family_refusal('sarvam_moe')})"
    assert load_deepseek_folder(folder).proposer_refusal == f"{folder} is not a complete MTP release ({family_refusal('sarvam_moe')}); it loads as a target only"


def test_weight_files_are_written_with_the_users_umask(tmp_path):
    """--format deepseek and --format hf (export_hf itself) write every file with the umask's mode; safetensors alone writes 0600."""
    from lab.release.deepseek.export import write_deepseek_folder
    from lab.release.hf_folder import export_hf
    from tests.hf_fixtures import write_tokenizer

    torch.manual_seed(0)
    model = build_model({"name": "hf", "config": {"model_type": "deepseek_v3", **DEEPSEEK}}, deepseek_head(1))
    write_tokenizer(tmp_path / "tokenizer")
    checkpoint = {"mtp_tokenizer": {"identity": {"kind": "bpe"}, "json": (tmp_path / "tokenizer" / "tokenizer.json").read_text()},
                  "mtp_manifest": {}}
    previous = os.umask(0o027)
    try:
        write_deepseek_folder(model, tmp_path / "deepseek")
        export_hf(checkpoint, tmp_path / "hf", model)
        model.trunk.hf.save_pretrained(tmp_path / "alone")
    finally:
        os.umask(previous)
    alone = sorted((tmp_path / "alone").glob("*.safetensors"))
    assert alone and {path.stat().st_mode & 0o777 for path in alone} == {0o600}  # what safetensors does alone
    shards = sorted((tmp_path / "deepseek").glob("*.safetensors")) + sorted((tmp_path / "hf").glob("*.safetensors"))
    assert len(shards) >= 2 and {path.stat().st_mode & 0o777 for path in shards} == {0o640}
    hf_files = [path for path in (tmp_path / "hf").iterdir() if path.is_file()]
    assert {path.suffix for path in hf_files} >= {".safetensors", ".json"} and {path.stat().st_mode & 0o777 for path in hf_files} == {0o640}

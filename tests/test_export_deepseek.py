"""DeepSeek-layout MTP heads that leave the harness and come back (docs/releases.md).

The real client is transformers' own MTP decoding (`generate(use_mtp=True)`, MTPCandidateGenerator): it reads
what `lab-export --format deepseek` writes and must draft, accept and emit what the harness's speculative
decoder does. The way back (`load_deepseek_folder`, `lab-generate DIR`, `init_from=hf:DIR`) follows the
alias contract: declared fusion order, the trunk's own embedding / lm_head / final norm, two gates.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors import safe_open

from lab.release.export import main as lab_export
from lab.release.deepseek.export import write_deepseek_folder
from lab.release.deepseek.load import deepseek_head, load_deepseek_folder
from lab.decode import generate
from lab.errors import ConfigError
from lab.model import build_model
from lab.model.heads.deepseek.drafter import DeepSeekChain
from lab.train import CONF_DIR
from tests.cli import SUBPROCESS_TIMEOUT, TINY, command_in_process
from tests.deepseek_fixtures import DEEPSEEK, N_MAIN, write_deepseek_release
from tests.fit_helpers import fit
from tests.helpers import make_batch

pytestmark = pytest.mark.usefixtures("single_thread")

NOT_MODEL = [o for o in TINY if not o.startswith("model.")]
HYDRA_CONFIG = "{model_type:deepseek_v3," + ",".join(f"{k}:{'null' if v is None else str(v).lower()}" for k, v in DEEPSEEK.items()) + "}"
PROMPTS = [torch.randint(3, DEEPSEEK["vocab_size"], (8,), generator=torch.Generator().manual_seed(seed)) for seed in range(4)]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir):
    """depth -> (last.ckpt, MTPModel): a real 4-step fit of head=deepseek on a tiny DeepSeek-V3 trunk, native depth blocks."""
    runs = {}

    def get(depth: int):
        if depth not in runs:
            with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
                cfg = compose("train", overrides=[
                    *NOT_MODEL, "model=hf", f"model.config={HYDRA_CONFIG}", "data.tokenizer=bpe", f"data.vocab_size={DEEPSEEK['vocab_size']}",
                    "head=deepseek", f"head.depth={depth}", "head.block=native", "head.hidden_input=post_norm", "head.chain_state=normed",
                    "optim.lr=1e-2", "optim.warmup_steps=1", f"paths.cache_dir={cache_dir}"])
            run_dir = tmp_path_factory.mktemp(f"deepseek{depth}")
            _, module, _ = fit(cfg, run_dir, max_steps=4, every=4)
            runs[depth] = (run_dir / "checkpoints" / "last.ckpt", module.model.eval())
        return runs[depth]

    return get


def transformers_mtp(folder: Path, depth: int, prompt: torch.Tensor, monkeypatch) -> dict:
    """transformers' own MTP decoding of `folder`, greedy: tokens, and per round its drafts and how many it accepted."""
    from transformers import AutoModelForCausalLM
    from transformers.generation.candidate_generator import MTPCandidateGenerator

    model, info = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32, output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"]
    # DeepseekV3ForCausalLM finds its MTP weights by the released checkpoint's layer id (`model\.layers\.61.*`, 61 main
    # layers); this tiny model keeps them after its N_MAIN = 2 layers, so the pattern is adjusted to those ids here.
    model._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{N_MAIN + i}\..*" for i in range(depth)]
    record = {"drafts": [], "accepted": []}
    get_candidates, update = MTPCandidateGenerator.get_candidates, MTPCandidateGenerator.update_candidate_strategy

    def recording_candidates(self, input_ids, *args, **kwargs):
        ids, logits = get_candidates(self, input_ids, *args, **kwargs)
        if logits is not None:  # the prefill pass drafts nothing
            record["drafts"].append(ids[0, input_ids.shape[1]:].tolist())
        return ids, logits

    def recording_update(self, input_ids, scores, num_matches):
        record["accepted"].append(int(num_matches))
        return update(self, input_ids, scores, num_matches)

    monkeypatch.setattr(MTPCandidateGenerator, "get_candidates", recording_candidates)
    monkeypatch.setattr(MTPCandidateGenerator, "update_candidate_strategy", recording_update)
    out = model.eval().generate(prompt[None], max_new_tokens=NEW_TOKENS, do_sample=False, use_mtp=True, eos_token_id=None, pad_token_id=0)
    monkeypatch.undo()
    record["accepted"] = record["accepted"][1:]  # the first call follows the prefill, which verified no draft
    record["tokens"] = out[0, prompt.shape[0]:].tolist()
    return record


def harness_speculative(model, prompt: torch.Tensor, monkeypatch) -> dict:
    drafts = []
    draft_chain = DeepSeekChain.draft_chain

    def recording(self, *args, **kwargs):
        result = draft_chain(self, *args, **kwargs)
        drafts.append(list(result[0]))
        return result

    monkeypatch.setattr(DeepSeekChain, "draft_chain", recording)
    out = generate(model, prompt, NEW_TOKENS, speculative=True)
    monkeypatch.undo()
    full = [i for i, (proposed, stopped) in enumerate(zip(out.stats["proposed_by_round"], out.stats["stopped_by_round"]))
            if proposed == model.head.depth and not stopped]  # rounds the output budget did not cut
    return {"tokens": out.tokens, "drafts": [drafts[i] for i in full], "accepted": [out.stats["accepted_by_round"][i] for i in full]}


def assert_same_decoding(ours: dict, theirs: dict, plain: list[int]) -> None:
    assert ours["tokens"] == theirs["tokens"] == plain
    rounds = len(ours["accepted"])
    assert rounds >= 5 and theirs["drafts"][:rounds] == ours["drafts"] and theirs["accepted"][:rounds] == ours["accepted"]


@pytest.mark.parametrize("depth", [1, 2])
def test_transformers_mtp_decoding_of_the_export_equals_the_harness_speculative_greedy(trained, depth, tmp_path, monkeypatch, capsys):
    ckpt, model = trained(depth)
    out = tmp_path / "release"
    lab_export([str(ckpt), "--format", "deepseek", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "MTP completeness: PASS" in printed and "fusion order: eh — what transformers' MtpLayer concatenates for deepseek_v3" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == depth and (out / "model.safetensors.index.json").is_file()
    accepted = set()
    for prompt in PROMPTS:
        ours = harness_speculative(model, prompt, monkeypatch)
        theirs = transformers_mtp(out, depth, prompt, monkeypatch)
        assert_same_decoding(ours, theirs, generate(model, prompt, NEW_TOKENS).tokens)
        accepted |= set(ours["accepted"])
    assert len(accepted) >= 2  # rejections and acceptances both happened: the drafts were really compared


@pytest.mark.parametrize("writer", ["shards", "save_pretrained"])
@pytest.mark.parametrize("depth", [1, 2])
def test_an_imported_release_decodes_as_transformers_does(depth, writer, tmp_path, monkeypatch):
    """A folder written by transformers plus released-layout MTP layers (random weights) — not by the harness; with
    writer=save_pretrained the main model is transformers' own save_pretrained (experts one by one, one file, no index)."""
    folder = write_deepseek_release(tmp_path / "release", depth=depth, writer=writer)
    imported = load_deepseek_folder(folder)
    assert imported.proposer_refusal is None and imported.fusion_order == "eh" and imported.model.head.depth == depth
    for prompt in PROMPTS[:2]:
        ours = harness_speculative(imported.model, prompt, monkeypatch)
        theirs = transformers_mtp(folder, depth, prompt, monkeypatch)
        assert_same_decoding(ours, theirs, generate(imported.model, prompt, NEW_TOKENS).tokens)


def source_model(fusion_order: str = "he", depth: int = 2):
    """A harness model in the transformers-compatible form, with non-trivial norms and an asymmetric projection."""
    torch.manual_seed(0)
    model = build_model({"name": "hf", "config": {"model_type": "deepseek_v3", **DEEPSEEK}}, deepseek_head(depth, fusion_order))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        model.trunk.final_norm.weight.copy_(0.5 + torch.rand(DEEPSEEK["hidden_size"], generator=g))
        for module in model.head.depth_modules:
            module.hidden_norm.weight.copy_(0.5 + torch.rand(DEEPSEEK["hidden_size"], generator=g))
            module.embed_norm.weight.copy_(1.5 + torch.rand(DEEPSEEK["hidden_size"], generator=g))
            module.proj.weight.copy_(torch.randn(module.proj.weight.shape, generator=g) / 8)
    return model.eval()


def horizon_logits(model, batch) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model.horizon_logits(h.k, h.hidden) for h in model(batch)]  # K × [B, S-k, V]


def probe_batch() -> dict:
    tokens = torch.randint(0, DEEPSEEK["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(7))
    return make_batch(tokens, [[0] * 6 + [1] * 5, [0] * 11])


def test_fusion_order_he_to_eh_round_trip_is_exact_and_a_wrong_declaration_shows(tmp_path):
    source = source_model("he")
    folder = tmp_path / "release"
    write_deepseek_folder(source, folder)
    d = DEEPSEEK["hidden_size"]
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(folder / index["model.layers.2.eh_proj.weight"], "pt") as handle:
        written = handle.get_tensor("model.layers.2.eh_proj.weight")  # [d, 2d], eh: embedding columns first
    he = source.head.depth_modules[0].proj.weight.detach()  # [d, 2d], he: hidden columns first
    assert torch.equal(written[:, :d], he[:, d:]) and torch.equal(written[:, d:], he[:, :d])

    batch = probe_batch()
    expected = horizon_logits(source, batch)
    back_he = load_deepseek_folder(folder).model  # declared eh (config.json), loaded into an he head: columns swapped back
    for got, want in zip(horizon_logits(back_he, batch), expected, strict=True):
        assert torch.equal(got, want)  # columns swapped back: the same weights and ops as the source, the same kernels
    back_eh = load_deepseek_folder(folder, head_order="eh").model  # kept as eh, computed as [embedding, hidden]
    for got, want in zip(horizon_logits(back_eh, batch), expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert json.loads((folder / "config.json").read_text())["mtp_fusion_order"] == "eh"  # what transformers runs: never a flag it ignores
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "mtp_fusion_order": "he"}))  # the same weights declared in the other order
    wrong = load_deepseek_folder(folder)
    assert wrong.model.head_cfg.name == "ntp" and "declares mtp_fusion_order=he, but transformers' MtpLayer for deepseek_v3 runs eh" in wrong.proposer_refusal


def test_imported_depths_alias_the_trunks_parts_and_hold_no_duplicate_optimizer_state(tmp_path):
    from lab.model.mtp import alias_groups
    from lab.training.optim import OptimConfig, build_optimizer

    folder = write_deepseek_release(tmp_path / "release", depth=2)
    model = load_deepseek_folder(folder).model
    shared, trunk = model.shared_parts(), model.trunk
    assert shared.embed is trunk.hf.get_input_embeddings() and shared.unembedding is trunk.hf.get_output_embeddings().weight
    assert shared.final_norm.weight is trunk.hf.model.norm.weight
    assert [name for name, p in model.head.named_parameters() if p.shape[0] == DEEPSEEK["vocab_size"]] == []  # no embedding or head copy
    assert not {id(p) for p in model.head.parameters()} & {id(p) for p in model.trunk.parameters()}
    assert alias_groups(model) == []  # every Parameter is listed once (untied: embedding and lm_head are separate)
    params = list(model.parameters())
    optimizer, _ = build_optimizer(model.train(), OptimConfig(warmup_steps=1), total_steps=2)
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert len(held) == len({id(p) for p in held}) == len(params)
    loss = sum(horizon_logits_with_grad(model, probe_batch()))
    loss.backward()
    optimizer.step()
    assert len(optimizer.state) == len(params)  # one Adam state per Parameter: the embedding's once, not per depth
    assert {id(p) for p in optimizer.state} == {id(p) for p in params}


def horizon_logits_with_grad(model, batch) -> list[torch.Tensor]:
    return [model.horizon_logits(h.k, h.hidden).logsumexp(-1).mean() for h in model(batch)]


def test_init_from_hf_folder_gives_the_imported_weights(tmp_path):
    from lab.release.init_from import load_parent_weights

    folder = write_deepseek_release(tmp_path / "release", depth=2)
    imported = load_deepseek_folder(folder).model
    torch.manual_seed(9)
    child = build_model({"name": "hf", "path": str(folder)}, deepseek_head(2))
    record = load_parent_weights(child, f"hf:{folder}")
    assert record["kind"] == "hf" and len(record["sha256"]) == 64
    own, theirs = child.state_dict(), imported.state_dict()
    assert own.keys() == theirs.keys() and all(torch.equal(own[k], theirs[k]) for k in own)
    pre_norm_child = build_model({"name": "hf", "path": str(folder)}, {**deepseek_head(2), "hidden_input": "pre_norm"})
    with pytest.raises(ConfigError, match=r"^head\.hidden_input: the folder's depths compute with head\.hidden_input=post_norm"):
        load_parent_weights(pre_norm_child, f"hf:{folder}")


def test_without_layer_n_it_loads_as_a_target_and_is_refused_as_a_proposer(tmp_path):
    folder = write_deepseek_release(tmp_path / "release", depth=1, drop_layers=(N_MAIN,))
    imported = load_deepseek_folder(folder)
    assert imported.model.head_cfg.name == "ntp" and imported.model.k == 1
    assert imported.proposer_refusal == f"{folder} is not a complete MTP release (MTP layer 2 (model.layers.2.*) is missing entirely); it loads as a target only"
    plain = subprocess.run(["lab-generate", str(folder), "--prompt", "def f1(x):", "--max-new-tokens", "4"], capture_output=True, text=True,
                           timeout=SUBPROCESS_TIMEOUT)
    assert plain.returncode == 0, plain.stderr[-2000:]
    refused = command_in_process("lab-generate", str(folder), "--prompt", "def f1(x):", "--speculative")  # the plain run: a real process
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [f"error: --speculative: {imported.proposer_refusal}"]
    from lab.release.init_from import load_parent_weights

    child = build_model({"name": "hf", "path": str(folder)}, deepseek_head(1))
    with pytest.raises(ConfigError, match=r"^init_from: .* lacks|^init_from: .*missing entirely"):
        load_parent_weights(child, f"hf:{folder}")
    one_key = write_deepseek_release(tmp_path / "one", depth=1, drop=("model.layers.2.hnorm.weight",))
    assert load_deepseek_folder(one_key).proposer_refusal.endswith(
        "(transformers reports 1 weight(s) missing (would be freshly initialised): model.layers.2.hnorm.weight); it loads as a target only")


def test_mtp_copies_of_shared_parts_must_equal_the_trunks(tmp_path):
    folder = write_deepseek_release(tmp_path / "release", depth=1)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    from safetensors.torch import load_file, save_file

    shard = index["model.layers.2.shared_head.norm.weight"]
    tensors = load_file(folder / shard)
    tensors["model.layers.2.shared_head.norm.weight"] = tensors["model.layers.2.shared_head.norm.weight"] * 1.5
    save_file(tensors, folder / shard, metadata={"format": "pt"})
    refusal = load_deepseek_folder(folder).proposer_refusal
    assert "(model.layers.2.shared_head.norm.weight differs from the trunk's final norm; the harness's depths use the trunk's own" in refusal


def test_export_refusals_name_the_field(tmp_path, cache_dir, capsys):
    cases = {
        "head.hidden_input": ({"config": {"model_type": "deepseek_v3", **DEEPSEEK}}, {**deepseek_head(1), "hidden_input": "pre_norm"}),
        "head.block": ({"config": {"model_type": "deepseek_v3", **DEEPSEEK}}, {**deepseek_head(1), "block": "lab"}),
        "head.chain_state": ({"config": {"model_type": "deepseek_v3", **DEEPSEEK}}, {**deepseek_head(2), "chain_state": "block_output"}),
        "--format": ({"config": {"model_type": "llama", "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                 "num_attention_heads": 4, "num_key_value_heads": 2}}, deepseek_head(1)),
    }
    for field, (model_cfg, head_cfg) in cases.items():
        model = build_model({"name": "hf", **model_cfg}, head_cfg)
        with pytest.raises(ConfigError) as error:
            write_deepseek_folder(model, tmp_path / field)
        assert error.value.field == field and not (tmp_path / field).exists()
    medusa = build_model({"name": "hf", "config": {"model_type": "deepseek_v3", **DEEPSEEK}}, {"name": "medusa", "k": 2, "compute_match": "none"})
    with pytest.raises(ConfigError, match=r"^--format: deepseek exports head=deepseek runs; this checkpoint's head is 'medusa'"):
        write_deepseek_folder(medusa, tmp_path / "m")

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*TINY, "head=deepseek", "head.depth=1", f"paths.cache_dir={cache_dir}"])
    fit(cfg, tmp_path / "gpt", max_steps=2, every=2)
    out = tmp_path / "gpt_release"
    with pytest.raises(SystemExit) as stop:
        lab_export([str(tmp_path / "gpt" / "checkpoints" / "last.ckpt"), "--format", "deepseek", "--out", str(out)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and lines == ["error: --format: deepseek needs a model=hf trunk of a family with MTP layers; this run trains the harness's GPT"]
    assert not out.exists() and not list(tmp_path.glob(".gpt_release.partial-*"))


def test_a_run_starts_from_a_released_folder_through_the_config(tmp_path, cache_dir):
    """`model=hf model.path=DIR init_from=hf:DIR head=deepseek …`: the run's depths start as the folder's, and it trains."""
    from lab.train import build

    folder = write_deepseek_release(tmp_path / "release", depth=2)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[
            *NOT_MODEL, "model=hf", f"model.path={folder}", f"init_from='hf:{folder}'", "head=deepseek", "head.depth=2", "head.block=native",
            "head.hidden_input=post_norm", "head.chain_state=normed", "head.trunk_grad=frozen", "optim.warmup_steps=1", f"paths.cache_dir={cache_dir}"])
    _, module = build(cfg)
    imported = load_deepseek_folder(folder).model.state_dict()
    own = module.model.state_dict()
    assert own.keys() == imported.keys() and all(torch.equal(own[k], imported[k]) for k in own)
    assert module.init_from["kind"] == "hf"
    trainer, module, _ = fit(cfg, tmp_path / "run", max_steps=2, every=2)
    assert trainer.global_step == 2


GLM4_MOE = dict(model_type="glm4_moe", vocab_size=300, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=N_MAIN,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                n_shared_experts=1, first_k_dense_replace=1, max_position_embeddings=128, tie_word_embeddings=False, partial_rotary_factor=0.5)


@pytest.mark.parametrize("depth", [1, 2])
def test_glm4_moe_exports_read_by_transformers_mtp_draft_what_the_harness_drafts(depth, tmp_path, monkeypatch):
    """The other family that declares MTP layers (random weights: every draft is compared, most are rejected)."""
    torch.manual_seed(0)
    model = build_model({"name": "hf", "config": GLM4_MOE}, deepseek_head(depth, "he")).eval()
    folder = tmp_path / "release"
    write_deepseek_folder(model, folder)
    for prompt in PROMPTS[:2]:
        ours = harness_speculative(model, prompt, monkeypatch)
        theirs = transformers_mtp(folder, depth, prompt, monkeypatch)
        assert_same_decoding(ours, theirs, generate(model, prompt, NEW_TOKENS).tokens)


def test_an_all_dense_trunks_export_is_read_by_transformers_mtp_as_the_moe_layer_it_builds(tmp_path, monkeypatch):
    """first_k_dense_replace > N: every main layer is dense, but transformers builds the MTP layer as MoE (get_mtp_config);
    the harness's depth block is that MoE layer, so the export holds the keys transformers reads and it drafts alike."""
    torch.manual_seed(0)
    config = {"model_type": "deepseek_v3", **DEEPSEEK, "first_k_dense_replace": N_MAIN + 1}
    model = build_model({"name": "hf", "config": config}, deepseek_head(1, "he")).eval()
    folder = tmp_path / "release"
    write_deepseek_folder(model, folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    assert f"model.layers.{N_MAIN}.mlp.experts.gate_up_proj" in index and f"model.layers.{N_MAIN - 1}.mlp.up_proj.weight" in index
    for prompt in PROMPTS[:2]:
        ours = harness_speculative(model, prompt, monkeypatch)
        theirs = transformers_mtp(folder, 1, prompt, monkeypatch)
        assert_same_decoding(ours, theirs, generate(model, prompt, NEW_TOKENS).tokens)

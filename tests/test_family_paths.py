"""Every family transformers gives MTP layers, as a model=hf trunk: a training step with native head blocks and the
harness's cached decoding either run (speculative greedy == plain greedy) or are refused in one line naming the family,
from the MTP family table (lab/model/mtp_families.py). Tiny random configs; no traceback on any path.
"""

from __future__ import annotations

import re

import pytest
import torch

from lab.decode import generate
from lab.errors import ConfigError
from lab.model import build_model
from lab.model.mtp_families import MTP_FAMILIES
from tests.cli import TINY, lab_train_in_process
from tests.helpers import loss_and_grads
from tests.test_hf_trunk import V, packed

pytestmark = pytest.mark.usefixtures("single_thread")

SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, n_routed_experts=4, num_experts=4, num_experts_per_tok=2, n_shared_experts=1,
             num_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1, max_position_embeddings=128, tie_word_embeddings=False)
MLA = dict(num_attention_heads=2, num_key_value_heads=2, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
FAMILY_SIZES = {  # what a family needs beyond SMALL (fields its config has) to build at this size
    "deepseek_v3": MLA, "sarvam_mla": MLA,
    "bailing_hybrid": dict(pad_token_id=0, bos_token_id=0, eos_token_id=0, num_experts_per_token=2),  # its name for top-k
    "deepseek_v4": dict(num_attention_heads=2, num_key_value_heads=1, head_dim=16, q_lora_rank=16, o_groups=2, o_lora_rank=16,
                        index_n_heads=2, index_head_dim=8, index_topk=4, hc_mult=2, sliding_window=8),
}
ATTENTION = {"deepseek_v4": "eager"}  # it has no sdpa path
NATIVE_HEADS = {"deepseek": {"name": "deepseek", "depth": 2, "block": "native"}, "parallel": {"name": "parallel", "k": 3, "block": "native"}}


def tiny_config(family: str) -> dict:
    from transformers import AutoConfig

    fields = vars(AutoConfig.for_model(family).get_text_config())
    sizes = {**SMALL, **FAMILY_SIZES.get(family, {})}
    skip = {"head_dim"} if family in ("deepseek_v3", "sarvam_mla") else set()  # MLA families derive it
    return {"model_type": family, **{k: v for k, v in sizes.items() if k in fields and k not in skip}}


def tiny_model(family: str, head: dict):
    torch.manual_seed(0)
    return build_model({"name": "hf", "config": tiny_config(family), "attn_implementation": ATTENTION.get(family, "sdpa")}, head)


def assert_one_line_naming(refused: pytest.ExceptionInfo, field: str, family: str, why: str) -> None:
    message = str(refused.value)
    assert message.startswith(f"{field}: ") and f"model_type '{family}': {why}" in message and "\n" not in message, message


@pytest.mark.parametrize("head", list(NATIVE_HEADS))
@pytest.mark.parametrize("family", sorted(MTP_FAMILIES))
def test_a_native_head_block_trains_on_each_family_or_is_refused_in_one_line(family, head):
    refusal = MTP_FAMILIES[family].native_block
    if refusal is not None:
        with pytest.raises(ConfigError) as refused:
            tiny_model(family, NATIVE_HEADS[head])
        assert_one_line_naming(refused, "head.block", family, refusal)
        return
    model = tiny_model(family, NATIVE_HEADS[head])
    loss, grads = loss_and_grads(model, packed())
    head_grads = {name: grad for name, grad in grads.items() if name.startswith("head.")}
    assert torch.isfinite(loss) and head_grads
    # every head block (the family's own layer) takes gradient: the rows really went through it
    per_block: dict[str, float] = {}
    for name, grad in head_grads.items():
        if ".block." in name or ".blocks." in name:
            prefix = re.match(r"head\.\w+\.\d+\.(block|blocks\.\d+)\.", name).group(0)  # e.g. head.depth_modules.0.block.
            per_block[prefix] = per_block.get(prefix, 0.0) + grad.abs().sum().item()
    assert len(per_block) >= 2 and all(total > 0 for total in per_block.values()), per_block


@pytest.mark.parametrize("family", sorted(MTP_FAMILIES))
def test_the_harness_decodes_each_family_exactly_or_refuses_in_one_line(family):
    block = "lab" if MTP_FAMILIES[family].native_block else "native"
    model = tiny_model(family, {"name": "deepseek", "depth": 2, "block": block}).eval()
    prompt = torch.tensor([3, 5, 7, 9, 11])
    refusal = MTP_FAMILIES[family].decoding
    if refusal is not None:
        for speculative in (False, True):
            with pytest.raises(ConfigError) as refused:
                generate(model, prompt, 6, speculative=speculative)
            assert_one_line_naming(refused, "model", family, refusal)
        return
    plain = generate(model, prompt, 8)
    drafted = generate(model, prompt, 8, speculative=True)
    assert drafted.tokens == plain.tokens and len(plain.tokens) == 8
    assert sum(drafted.stats["proposed_by_position"]) > 0  # the depths did propose
    assert drafted.stats["target_forwards"] <= plain.stats["target_forwards"]


CLI_REFUSALS = {  # family -> (head overrides, the field the one line names)
    "bailing_hybrid": (["head.block=native"], "head.block: native cannot run this trunk's decoder layer"),
    "inkling_text": ([], "callbacks.decoding: decodes after the last step, and the harness cannot decode this trunk"),
}


@pytest.mark.parametrize("family", list(CLI_REFUSALS))
def test_the_cli_refuses_what_the_family_cannot_run_before_any_run_folder(family, cache_dir, tmp_path):
    head, start = CLI_REFUSALS[family]
    config = ",".join(f"{key}:{value}" for key, value in tiny_config(family).items())
    run_dir = tmp_path / "run"
    out = lab_train_in_process(*[o for o in TINY if not o.startswith("model.")], "model=hf", "model.path=null", f"model.config={{{config}}}",
                               "head=deepseek", "head.depth=1", *head, f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {start}") and f"model_type '{family}': " in lines[0], lines
    assert not run_dir.exists()


def test_the_end_of_run_decoding_check_follows_the_table_and_its_off_switch():
    from transformers import AutoConfig

    from lab.config.checks import check_decoding_callback
    from lab.model.mtp_families import family_path_refusal

    def refusal(family: str) -> str | None:  # what the hf trunk family's pre-flight returns for this config
        return family_path_refusal(AutoConfig.for_model(family), "decoding")

    on, off = {"decoding": {"prompts": 4}}, {"decoding": {"prompts": 0}}
    check_decoding_callback(on, refusal("glm4_moe"))  # a family the harness decodes
    check_decoding_callback(off, refusal("nemotron_h"))
    check_decoding_callback({}, refusal("nemotron_h"))  # no decoding callback configured
    with pytest.raises(ConfigError) as refused:
        check_decoding_callback(on, refusal("nemotron_h"))
    assert_one_line_naming(refused, "callbacks.decoding", "nemotron_h", MTP_FAMILIES["nemotron_h"].decoding)

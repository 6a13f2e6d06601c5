"""`lab-export --format medusa`: vLLM's Medusa layout beside a pointer to the base, read back exactly by the harness."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors import safe_open

from lab.release.export import main as lab_export
from lab.decode import generate
from lab.decode.loading import load_for_generation
from lab.train import CONF_DIR
from tests.cli import TINY
from tests.fit_helpers import fit
from tests.helpers import make_batch
from tests.hf_fixtures import write_llama

pytestmark = pytest.mark.usefixtures("single_thread")

NOT_MODEL = [o for o in TINY if not o.startswith("model.")]
LLAMA = "{model_type:llama,vocab_size:300,hidden_size:32,intermediate_size:64,num_hidden_layers:2,num_attention_heads:4,num_key_value_heads:2}"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return write_llama(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, llama_dir, cache_dir):
    """name -> (last.ckpt, trained MTPModel): a frozen replicated Medusa on a base folder (the export points at it),
    and a jointly trained shared-unembedding Medusa on a config-built base (the export writes the trunk beside it)."""
    variants = {
        "frozen_replicated": ["model=hf", f"model.path={llama_dir}", "head.trunk_grad=frozen", "head.unembedding=replicated"],
        "joint_shared": ["model=hf", f"model.config={LLAMA}", "data.tokenizer=bpe", "data.vocab_size=300"],
    }
    out = {}
    for name, overrides in variants.items():
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("train", overrides=[*NOT_MODEL, *overrides, "head=medusa", "head.k=3", "head.n_layers=2", "optim.lr=1e-2",
                                              "optim.warmup_steps=1", f"paths.cache_dir={cache_dir}"])
        run_dir = tmp_path_factory.mktemp(name)
        _, module, _ = fit(cfg, run_dir, max_steps=2, every=2)
        out[name] = (run_dir / "checkpoints" / "last.ckpt", module.model.eval())
    return out


def probe() -> dict:
    g = torch.Generator().manual_seed(1)
    return make_batch(torch.randint(0, 300, (2, 12), generator=g), [[0] * 5 + [1] * 7, [0] * 12])


def all_logits(model, batch) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model.horizon_logits(h.k, h.hidden) for h in model(batch)]  # K × [B, S-k, V]


def export_to(ckpt: Path, out: Path, capsys) -> str:
    lab_export([str(ckpt), "--format", "medusa", "--out", str(out)])
    return capsys.readouterr().err


@pytest.mark.parametrize("name", ["frozen_replicated", "joint_shared"])
def test_round_trip_keeps_every_horizons_logits_bitwise(runs, name, tmp_path, capsys, llama_dir):
    ckpt, trained = runs[name]
    out = tmp_path / "medusa"
    err = export_to(ckpt, out, capsys)
    assert "vLLM's drafts differ" in err  # the final norm's place is said, not hidden
    pointer = json.loads((out / "config.json").read_text())["base_model"]
    if name == "frozen_replicated":  # the base never changed: pointed at, not copied
        assert pointer["path"] == str(llama_dir.resolve()) and not (out / "base").exists()
        assert pointer == trained.trunk.base_identity
    else:  # trained trunk: written beside the heads
        assert pointer["path"] == "base" and (out / "base" / "config.json").is_file()
    loaded = load_for_generation(out)
    assert loaded.source == "medusa" and loaded.model.k == 3
    batch = probe()
    for got, expected in zip(all_logits(loaded.model, batch), all_logits(trained, batch), strict=True):
        assert torch.equal(got, expected)  # the same head class and weights on the same batch: the same kernels
    prompt = torch.tensor([5, 17, 42, 7])
    ours = generate(trained, prompt, 10, speculative=True)
    theirs = generate(loaded.model, prompt, 10, speculative=True)
    assert ours.tokens == theirs.tokens and ours.stats["accepted_by_round"] == theirs.stats["accepted_by_round"]


def test_keys_and_shapes_follow_vllms_medusa_layout(runs, tmp_path, capsys):
    """Spelled from vLLM's Medusa (model_executor/models/medusa.py, transformers_utils/configs/medusa.py):
    `blocks.{h}.layers.{l}` are d×d linears (with a bias when `medusa_fc_bias`), `lm_heads.{h}` V×d projections,
    num_heads heads of num_hidden_layers blocks; `original_lm_head` means one lm_head, read from lm_heads.0."""
    for name, unembedding in (("frozen_replicated", "replicated"), ("joint_shared", "shared")):
        ckpt, trained = runs[name]
        out = tmp_path / name
        export_to(ckpt, out, capsys)
        config = json.loads((out / "config.json").read_text())
        d, vocab = 32, 300
        assert config["model_type"] == "medusa" and config["architectures"] == ["MedusaModel"]
        assert (config["hidden_size"], config["vocab_size"], config["truncated_vocab_size"]) == (d, vocab, vocab)
        assert (config["num_heads"], config["num_hidden_layers"], config["medusa_fc_bias"]) == (2, 2, True)
        assert config["original_lm_head"] is (unembedding == "shared")
        expected = {f"blocks.{h}.layers.{layer}.weight": (d, d) for h in range(2) for layer in range(2)}
        expected |= {f"blocks.{h}.layers.{layer}.bias": (d,) for h in range(2) for layer in range(2)}
        expected |= {"lm_heads.0.weight": (vocab, d)} if unembedding == "shared" else {f"lm_heads.{h}.weight": (vocab, d) for h in range(2)}
        with safe_open(out / "model.safetensors", "pt") as file:
            assert {key: tuple(file.get_slice(key).get_shape()) for key in file.keys()} == expected
            # vLLM's ResidualBlock: x ← x + SiLU(layer(x)) for each layer in order; head h drafts horizon h + 2
            x = torch.randn(3, d, generator=torch.Generator().manual_seed(2))
            y = x
            for layer in range(2):
                weight, bias = file.get_tensor(f"blocks.1.layers.{layer}.weight"), file.get_tensor(f"blocks.1.layers.{layer}.bias")
                y = y + torch.nn.functional.silu(y @ weight.T + bias)  # [3, d]
            assert not torch.equal(y, x)  # trained blocks, not the zero init
            with torch.no_grad():
                torch.testing.assert_close(trained.head.blocks[1](x), y, rtol=0, atol=1e-6)


def test_refusals_name_the_field_and_leave_nothing(runs, tmp_path, capsys, cache_dir):
    ckpt, _ = runs["frozen_replicated"]
    out = tmp_path / "exists"
    out.mkdir()
    (out / "x").write_text("x")
    with pytest.raises(SystemExit) as stop:
        lab_export([str(ckpt), "--format", "medusa", "--out", str(out)])
    assert stop.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [f"error: --out: {out} exists and is not an empty folder; choose a new one"]

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*TINY, "head=parallel", "head.k=2", f"paths.cache_dir={cache_dir}"])
    fit(cfg, tmp_path / "parallel", max_steps=2, every=2)
    with pytest.raises(SystemExit) as stop:
        lab_export([str(tmp_path / "parallel" / "checkpoints" / "last.ckpt"), "--format", "medusa", "--out", str(tmp_path / "p")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: --format: medusa exports head=medusa runs")
    assert not (tmp_path / "p").exists() and not list(tmp_path.glob(".p.partial-*"))


def test_reader_refuses_a_base_that_is_not_the_one_named(runs, tmp_path, capsys):
    from lab.release.medusa import load_medusa
    from lab.errors import ConfigError

    ckpt, _ = runs["joint_shared"]
    out = tmp_path / "medusa"
    export_to(ckpt, out, capsys)
    other = tmp_path / "other"
    write_llama(other, seed=3, tokenizer=False)
    shutil.copy(other / "model.safetensors", out / "base" / "model.safetensors")  # same shapes, other weights
    with pytest.raises(ConfigError, match=r"^base_model: weights_sha256 of the base at .* differs"):
        load_medusa(out)


def test_init_from_a_medusa_folder_gives_its_heads(runs, tmp_path, capsys):
    from lab.release.init_from import load_parent_weights
    from lab.model import build_model

    ckpt, trained = runs["frozen_replicated"]
    out = tmp_path / "medusa"
    export_to(ckpt, out, capsys)
    base = trained.trunk.base_identity["path"]
    child = build_model({"name": "hf", "path": base}, {"name": "medusa", "k": 3, "n_layers": 2, "unembedding": "replicated", "trunk_grad": "frozen"})
    record = load_parent_weights(child, str(out))
    assert record["kind"] == "medusa"
    batch = probe()
    for got, expected in zip(all_logits(child.eval(), batch), all_logits(trained, batch), strict=True):
        assert torch.equal(got, expected)  # the same head class and weights on the same batch: the same kernels

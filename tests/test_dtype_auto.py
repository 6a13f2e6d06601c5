"""`model.dtype=auto`: bfloat16 only where the hardware computes it natively, resolved once and recorded."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_dir

from lab.model.dtype_choice import resolve_dtype
from lab.run.record import RunRecord
from lab.train import CONF_DIR
from tests.cli import TINY, lab_train, read_run

pytestmark = pytest.mark.usefixtures("single_thread")

NOT_MODEL = [o for o in TINY if not o.startswith("model.")]
LLAMA = "{model_type:llama,vocab_size:300,hidden_size:32,intermediate_size:64,num_hidden_layers:2,num_attention_heads:4,num_key_value_heads:2}"
HF_AUTO = [*NOT_MODEL, "model=hf", f"model.config={LLAMA}", "data.tokenizer=bpe", "data.vocab_size=300", "model.dtype=auto",
           "head=medusa", "head.k=3", "head.trunk_grad=frozen"]


def hardware(monkeypatch, cuda: bool = False, avx512_bf16: bool = False, amx: bool = False) -> None:
    """Pretend to be a machine with (or without) each native bf16 feature torch probes."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: cuda)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "Pretend GPU")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)


@pytest.mark.parametrize("machine, expected", [
    ({}, "float32"),  # AVX2 or plain AVX-512: bf16 would be emulated
    ({"avx512_bf16": True}, "bfloat16"),
    ({"amx": True}, "bfloat16"),
    ({"cuda": True}, "bfloat16"),
])
def test_auto_takes_bfloat16_only_with_native_bf16(monkeypatch, machine, expected):
    hardware(monkeypatch, **machine)
    choice = resolve_dtype("auto")
    assert choice.name == expected
    if expected == "float32":
        assert torch.backends.cpu.get_cpu_capability() in choice.reason  # the line names what the CPU has
    assert {name: resolve_dtype(name).name for name in ("float32", "bfloat16")} == {"float32": "float32", "bfloat16": "bfloat16"}


@pytest.mark.parametrize("native, dtype", [(False, torch.float32), (True, torch.bfloat16)])
def test_auto_composes_builds_in_the_resolved_dtype_and_records_it(monkeypatch, capsys, tmp_path, cache_dir, native, dtype):
    from lab.train import build

    hardware(monkeypatch, avx512_bf16=native)
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=[*HF_AUTO, f"paths.cache_dir={cache_dir}"])
    record = RunRecord(tmp_path, [])
    _, module = build(cfg, record)
    assert {p.dtype for p in module.model.parameters()} == {dtype}
    assert module.hparams.model["dtype"] == str(dtype).removeprefix("torch.")  # checkpoints keep the concrete dtype
    assert record.fields["model_dtype"]["resolved"] == str(dtype).removeprefix("torch.")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("model.dtype=auto")]
    assert len(said) == 1 and str(dtype).removeprefix("torch.") in said[0]


def test_smollm2_defaults_to_auto():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["model=smollm2"])
    assert cfg.model.dtype == "auto"


def test_auto_run_says_and_records_its_dtype_in_run_json(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    out = lab_train(*HF_AUTO, "trainer.max_steps=2", "callbacks.decoding.prompts=2", f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    expected = resolve_dtype("auto").name  # this machine's answer (the rule itself is tested above)
    assert f"model.dtype=auto: {expected} (" in out.stdout
    record = read_run(run_dir)
    assert record["model_dtype"]["setting"] == "auto" and record["model_dtype"]["resolved"] == expected, json.dumps(record)[:2000]

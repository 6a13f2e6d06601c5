"""Release export (lab/release/export.py): next-token-only releases give the full model's next-token logits."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
import torch

from lab.release.export import export, load_release, load_release_tokenizer
from tests.head_cases import case, overrides, without
from tests.fit_helpers import compose_cfg, fit
from tests.cli import SUBPROCESS_TIMEOUT

HEADS = {name: overrides(head) for name, head in {  # every head with extra horizons to export
    **without("ntp", "identity", "medusa", "deepseek", "anticausal"),
    "anticausal": case("anticausal", 2),  # horizon 1 runs through every stack
    "linear_replicated": case("linear", 2, unembedding="replicated"),
    "medusa_replicated": case("medusa", unembedding="replicated"),  # horizon 1 keeps the trunk's lm_head
}.items()}
HEADS["deepseek_bpe"] = [*overrides(case("deepseek")), "data.tokenizer=bpe", "data.vocab_size=300"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir):
    """`trained(name)`: a real 2-step fit of that head, once per module → (name, last.ckpt, model, datamodule)."""
    runs = {}

    def get(name: str):
        if name not in runs:
            run_dir = tmp_path_factory.mktemp(name)
            _, module, datamodule = fit(compose_cfg(*HEADS[name], cache_dir=cache_dir), run_dir, max_steps=2)
            runs[name] = (name, run_dir / "checkpoints" / "last.ckpt", module.model.eval(), datamodule)
        return runs[name]

    return get


def real_batch(datamodule) -> dict:
    return next(iter(datamodule.val_dataloader()))


@pytest.mark.parametrize("head", sorted(HEADS))
def test_release_gives_the_full_models_next_token_logits(trained, head, tmp_path):
    name, ckpt, full, datamodule = trained(head)
    record = export(ckpt, tmp_path / "release")
    release = load_release(tmp_path / "release")
    batch = real_batch(datamodule)
    assert torch.equal(release.next_token_logits(batch), full.next_token_logits(batch))  # same modules and weights, same batch: same kernels

    assert release.k == 1 and release.head_cfg.name == ("linear" if name == "linear" else "ntp")
    assert record["parent_sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    horizons = torch.load(ckpt, weights_only=True)["mtp_manifest"]["horizons"]
    auxiliary = set() if name == "anticausal" else {key for key, horizon in horizons.items() if horizon != 1}
    assert set(record["removed_keys"]) == auxiliary
    on_disk = json.loads((tmp_path / "release" / "release.json").read_text())
    assert on_disk == record and not on_disk["keep_heads"]
    if name == "deepseek_bpe":
        tokenizer = load_release_tokenizer(tmp_path / "release")
        assert tokenizer.identity == datamodule.tokenizer_identity
        text = "def resume(ckpt_path):\n    return last\n"
        assert tokenizer.encode(text) == datamodule.tokenizer.encode(text)


def test_cli_keep_heads_round_trip_and_refusals(trained, tmp_path):
    _, ckpt, full, datamodule = trained("parallel")
    out = tmp_path / "full"
    result = subprocess.run(["lab-export", str(ckpt), "--out", str(out), "--keep-heads"], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-2000:]
    release = load_release(out)
    assert release.k == 3 and json.loads((out / "release.json").read_text())["removed_keys"] == []
    batch = real_batch(datamodule)
    with torch.no_grad():
        for got, expected in zip(release(batch), full(batch)):
            assert torch.equal(got.hidden, expected.hidden)  # same modules and weights, same batch: same kernels

    again = subprocess.run(["lab-export", str(ckpt), "--out", str(out)], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [f"error: --out: {out} exists and is not an empty folder; choose a new one"]
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(ckpt.read_bytes()[:1000])
    broken = subprocess.run(["lab-export", str(bad), "--out", str(tmp_path / "x")], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert broken.returncode == 2 and broken.stderr.startswith("error: checkpoint: ") and len(broken.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_a_release_with_a_quantised_tensor_is_refused_by_key_and_dtype(trained, tmp_path):
    """An int8 tensor in place of a float weight (no scale): load_state_dict would cast it quietly; the release is refused."""
    from safetensors.torch import load_file, save_file

    from lab.errors import ConfigError

    _, ckpt, _, _ = trained("parallel")
    export(ckpt, tmp_path / "release")
    tensors = load_file(tmp_path / "release" / "model.safetensors")
    key = next(k for k in sorted(tensors) if k.endswith(".weight") and tensors[k].dim() == 2)
    tensors[key] = tensors[key].to(torch.int8)
    save_file(tensors, tmp_path / "release" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ConfigError) as refused:
        load_release(tmp_path / "release")
    assert str(refused.value).startswith(f"{key}: is stored as int8 with no scale beside it: quantised weights would be cast to float")

"""Throughput metrics: FLOPs per token (hand-counted oracle), peak FLOP/s by name, MFU from a real Trainer."""

import pytest
import pytorch_lightning as pl
import torch

from lab.callbacks.peak_flops import PEAK_BF16_FLOPS, peak_name_of, resolve_peak_flops
from lab.callbacks.throughput import TokenThroughput
from lab.errors import ConfigError
from lab.nn.flops import training_flops_per_token
from tests.fit_helpers import compose_cfg, fit
from tests.helpers import build_model

S = 12


def block_flops(d, ratio, rows):
    """q/k/v + output (4d²) and MLP (2·ratio·d²) matmuls, 2 FLOPs per multiply-add; QKᵀ and PV: 2·2·rows²·d."""
    return 2 * rows * (4 + 2 * ratio) * d * d + 4 * rows * rows * d


@pytest.mark.parametrize("head", [dict(name="ntp", k=1), dict(name="parallel", k=3), dict(name="deepseek", k=3, depth=2)])
def test_counted_flops_match_a_hand_count(head):
    model = build_model(**head, layers=4)
    cfg = model.model_cfg
    d, ratio, V = cfg.d_model, cfg.mlp_ratio, cfg.vocab_size
    trunk = len(model.trunk.blocks) * block_flops(d, ratio, S)
    projections = sum(2 * (S - k) * d * V for k in range(1, model.k + 1))  # horizon k: S-k rows × [d, V]
    if head["name"] == "parallel":
        heads = 3 * block_flops(d, ratio, S)  # one block per head, on all S rows
    elif head["name"] == "deepseek":
        heads = sum(2 * (S - j) * 2 * d * d + block_flops(d, ratio, S - j) for j in (1, 2))  # depth j on S-j rows
    else:
        heads = 0
    expected = 3 * (trunk + heads + projections) / S
    assert training_flops_per_token(model, S) == pytest.approx(expected, rel=1e-12)


def test_peak_flops_by_name_number_and_device():
    assert resolve_peak_flops("H100", torch.device("cpu")) == PEAK_BF16_FLOPS["H100"] == 989.4e12
    assert resolve_peak_flops("A100", torch.device("cpu")) == 312e12
    assert resolve_peak_flops(2.5e14, torch.device("cpu")) == 2.5e14
    assert resolve_peak_flops("auto", torch.device("cpu")) is None  # no MFU on CPU unless a peak is given
    assert peak_name_of("NVIDIA H100 80GB HBM3") == "H100" and peak_name_of("NVIDIA H100 PCIe") == "H100-PCIe"
    assert peak_name_of("NVIDIA H200") == "H200" and peak_name_of("NVIDIA A100-SXM4-80GB") == "A100"
    assert peak_name_of("NVIDIA GeForce RTX 4090") is None
    for bad in ("V100", -1.0, 0, True):
        with pytest.raises(ConfigError) as error:
            resolve_peak_flops(bad, torch.device("cpu"))
        assert error.value.field == "callbacks.throughput.peak_flops"


class Logged(pl.Callback):
    """The throughput values as logged, after the throughput callback's own hook."""

    def __init__(self):
        self.values = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if "train/tokens_per_s" in trainer.progress_bar_metrics:
            self.values.append(dict(trainer.progress_bar_metrics))


def test_mfu_is_flops_times_tokens_per_second_over_peak(tmp_path, cache_dir):
    peak = 1e11
    throughput, logged = TokenThroughput(window=2, peak_flops=peak), Logged()
    cfg = compose_cfg("head=parallel", "head.k=2", cache_dir=cache_dir)
    _, module, _ = fit(cfg, tmp_path, max_steps=4, every=4, callbacks=[throughput, logged])
    seq_len = cfg.data.seq_len
    assert throughput.flops_per_token == training_flops_per_token(module.model, seq_len) > 0
    assert logged.values  # logged on Lightning's logging steps (the last step at least)
    last = logged.values[-1]
    assert last["train/tokens_per_s"] > 0
    assert last["train/mfu"] == pytest.approx(throughput.flops_per_token * last["train/tokens_per_s"] / peak, rel=1e-6)
    assert "mem/cuda_peak_bytes" not in last  # CPU: no CUDA allocator to read

"""Validation bits (`val/bpb`, `val/bits_per_token`): what is counted, on a real Trainer.validate."""

from __future__ import annotations

import json
import math

import pytest
import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from lab.callbacks.horizon_metrics import HorizonMetrics
from lab.data import LMDataModule
from lab.training.module import MTPLitModule
from tests.helpers import VOCAB, model_config, packed_batch

pytestmark = pytest.mark.usefixtures("single_thread")


class OneBatch(pl.LightningDataModule):
    """The validation set is one hand-built batch; `target_byte_lengths` only when given."""

    def __init__(self, batch: dict, target_byte_lengths: torch.Tensor | None):
        super().__init__()
        self.batch = batch
        if target_byte_lengths is not None:
            self.target_byte_lengths = target_byte_lengths

    def val_dataloader(self):
        return DataLoader([self.batch], batch_size=None)


def validate(target_byte_lengths) -> tuple[dict, MTPLitModule, dict]:
    torch.manual_seed(0)
    module = MTPLitModule(
        model=dict(vars(model_config(2))), head={"name": "parallel", "k": 2, "compute_match": "none"},
        reduction={"policy": "head_mean"}, weights={"name": "uniform"}, schedule={"name": "sequential"},
        optim={}, total_steps=1,
    )
    batch = packed_batch()
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[HorizonMetrics()])
    trainer.validate(module, datamodule=OneBatch(batch, target_byte_lengths), verbose=False)
    return {name: float(value) for name, value in trainer.callback_metrics.items()}, module, batch


def next_token_bits(module: MTPLitModule, batch: dict) -> float:
    """Σ cross-entropy over every valid next-token target, in bits, from the full logits."""
    seq_len = batch["tokens"].shape[1]
    logits = module.model.next_token_logits(batch)[:, : seq_len - 1]  # [B, S-1, V]: row t predicts tokens[t+1]
    targets = batch["tokens"][:, 1:]  # [B, S-1]
    valid = batch["active"][:, 1:] & batch["active"][:, :-1] & (batch["segment_ids"][:, 1:] == batch["segment_ids"][:, :-1])
    return F.cross_entropy(logits[valid], targets[valid], reduction="sum").item() / math.log(2)


def test_bits_per_byte_and_per_token_hand_computed():
    # packed_batch: row 0 = documents of 7 and 5 tokens (6 + 4 targets), row 1 = 8 tokens and
    # 4 pads (7 targets): 17 next-token targets. Every id stands for 2 bytes: 34 bytes.
    metrics, module, batch = validate(torch.full((VOCAB,), 2, dtype=torch.long))
    bits = next_token_bits(module, batch)
    assert metrics["val/count/h1"] == 17
    assert math.isclose(metrics["val/bits_per_token"], bits / 17, rel_tol=1e-6)
    assert math.isclose(metrics["val/bpb"], bits / 34, rel_tol=1e-6)
    assert math.isclose(metrics["val/loss"], bits * math.log(2) / 17, rel_tol=1e-6)


def test_only_supervised_targets_count_bytes():
    # The padding id 0 is never a target; giving it 1000 bytes shows if padding were counted.
    lengths = torch.full((VOCAB,), 2, dtype=torch.long)
    lengths[0] = 1000
    metrics, module, batch = validate(lengths)
    assert math.isclose(metrics["val/bpb"], next_token_bits(module, batch) / 34, rel_tol=1e-6)


def test_without_byte_lengths_only_bits_per_token_is_logged():
    metrics, module, batch = validate(None)
    assert "val/bpb" not in metrics
    assert math.isclose(metrics["val/bits_per_token"], next_token_bits(module, batch) / 17, rel_tol=1e-6)


def test_lm_datamodule_counts_eos_as_one_byte_and_other_specials_as_none(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": f"naïve café {i} — 東京\n" * 3}) + "\n" for i in range(12)))
    datamodule = LMDataModule(source="jsonl", path=[str(path)], seq_len=16, batch_size=2, val_fraction=0.2,
                              cache_dir=str(tmp_path / "cache"))
    datamodule.prepare()
    lengths = datamodule.target_byte_lengths
    tokenizer = datamodule.tokenizer
    assert lengths.shape == (tokenizer.vocab_size,)
    assert lengths[tokenizer.eos_id] == 1 and lengths[tokenizer.bos_id] == 0 and lengths[tokenizer.pad_id] == 0
    assert bool((lengths[:256] == 1).all())  # the byte tokenizer: one byte per id

"""Per-horizon loss, accuracy, counts, weights (train) and loss, accuracy, bits, chain acceptance (val);
under a draft vocabulary (head.draft_vocab), the share of each horizon ≥ 2's targets it covers (both).

Bits, over the horizon-1 (next-token) predictions of the validation set, every valid
target included (EOS too: the model must predict where a document ends):

    val/bits_per_token = Σ CE / ln 2 / (number of targets)
    val/bpb            = Σ CE / ln 2 / (Σ bytes of the targets)

A target's bytes are its token's UTF-8 bytes, and 1 for EOS (the document terminator), so
both metrics cover exactly the predictions in `val/loss`. `val/bpb` is logged only when the
datamodule provides `target_byte_lengths` ([V], see LMDataModule); without it only
`val/bits_per_token` is. With the byte tokenizer the two are equal.

Under DDP, sums and counts are all-reduced; the validation sampler hands every row to
exactly one rank, so nothing is counted twice.
"""

from __future__ import annotations

import math

import pytorch_lightning as pl
import torch

from lab.training.cadence import logs_this_step
from lab.training.step import step_outputs


def chain_acceptance_counts(row_correct: list[torch.Tensor], masks: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per k: (#rows with horizons 1..k valid and all correct, #those rows with 1..k-1 correct).

    Row t takes part at horizon k only when horizons 1..k are all supervised at t, so both
    counts refer to the same rows and their ratio is P(k correct | 1..k-1 correct).
    """
    accepted, prefix_ok = [], []
    for k in range(1, len(masks) + 1):
        rows = masks[k - 1].shape[1]  # S-k source rows have a horizon-k label
        valid = torch.stack([m[:, :rows] for m in masks[:k]]).all(0)  # [B, S-k]
        correct = torch.stack([c[:, :rows] for c in row_correct[:k]])  # [k, B, S-k]
        prefix = correct[:-1].all(0) if k > 1 else torch.ones_like(valid)  # [B, S-k]
        accepted.append((valid & prefix & correct[-1]).sum())
        prefix_ok.append((valid & prefix).sum())
    return torch.stack(accepted).double(), torch.stack(prefix_ok).double()


def ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return torch.where(denominator > 0, numerator / denominator.clamp_min(1), torch.full_like(numerator, float("nan")))


class HorizonMetrics(pl.Callback):
    """Training metrics on the steps whose metrics reach the loggers (`trainer.log_every_n_steps`); nothing on the others."""

    def __init__(self, log_every_n_steps: int = 1):
        self.log_every_n_steps = log_every_n_steps  # further thinning: only steps with global_step % n == 0
        self._val: dict[str, torch.Tensor] = {}
        self._target_bytes: torch.Tensor | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if not logs_this_step(trainer):
            return
        step = step_outputs(outputs)
        if step is None or trainer.global_step % self.log_every_n_steps:
            return
        counts = step.counts
        active = step.active_horizons or counts.numel()
        metrics = {"train/active_horizons": torch.tensor(float(active))}
        for k in range(1, counts.numel() + 1):
            i = k - 1
            metrics[f"train/count/h{k}"] = counts[i]
            metrics[f"train/weight_eff/h{k}"] = step.effective_weights[i]
            metrics[f"train/lambda/h{k}"] = step.lambdas[i]
            metrics[f"train/coef/h{k}"] = step.coefficients[i]  # this rank's (differs per rank under count_scope=local)
            # A skipped horizon (λ = 0 for good) has no loss or accuracy: NaN, like a ratio without rows
            # (leaving it out would let Lightning repeat its last value).
            skipped = torch.tensor(float("nan")) if k > active else None
            metrics[f"train/loss/h{k}"] = step.loss_sums[i] / counts[i].clamp_min(1) if skipped is None else skipped
            if step.correct is not None:
                metrics[f"train/acc/h{k}"] = step.correct[i] / counts[i].clamp_min(1) if skipped is None else skipped
        if step.draft_coverage is not None:  # head.draft_vocab: share of each horizon's targets inside the draft vocabulary
            for k, (covered, total) in enumerate(step.draft_coverage, start=2):
                metrics[f"train/draft_vocab_coverage/h{k}"] = ratio(covered, total)
        pl_module.log_dict({name: value.float() for name, value in metrics.items()}, on_step=True, on_epoch=False, batch_size=1)

    def on_validation_epoch_start(self, trainer, pl_module):
        self._val = {}
        byte_lengths = getattr(trainer.datamodule, "target_byte_lengths", None) if trainer.datamodule is not None else None
        self._target_bytes = None if byte_lengths is None else byte_lengths.to(pl_module.device)  # [V]

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        stats = outputs["stats"]
        accepted, prefix_ok = chain_acceptance_counts(stats.row_correct, [h.mask for h in outputs["horizons"]])
        update = {
            "sums": stats.loss_sums.double(),
            "counts": stats.counts.double(),
            "correct": stats.correct.double(),
            "accepted": accepted,
            "prefix_ok": prefix_ok,
        }
        coverage = [h.draft_coverage for h in outputs["horizons"][1:] if h.draft_coverage is not None]
        if coverage:
            update["draft_coverage"] = torch.stack(coverage).double()  # [K-1, 2]
        if self._target_bytes is not None:
            first = outputs["horizons"][0]
            targets = first.labels[first.mask]  # [N_1] the next-token targets that count
            update["bytes"] = self._target_bytes[targets].sum().double().reshape(1)
        for name, value in update.items():
            self._val[name] = self._val.get(name, 0) + value.cpu()

    def on_validation_epoch_end(self, trainer, pl_module):
        if not self._val or trainer.sanity_checking:
            return
        total = {name: pl_module.all_reduce_sum(value.to(pl_module.device)).cpu() for name, value in self._val.items()}
        losses = ratio(total["sums"], total["counts"])
        accuracy = ratio(total["correct"], total["counts"])
        chain = ratio(total["accepted"], total["prefix_ok"])
        bits = total["sums"][0] / math.log(2)
        metrics = {"val/loss": losses[0], "val/bits_per_token": ratio(bits, total["counts"][0])}
        if "bytes" in total:
            metrics["val/bpb"] = ratio(bits, total["bytes"][0])
        for k in range(1, losses.numel() + 1):
            metrics[f"val/loss/h{k}"] = losses[k - 1]
            metrics[f"val/acc/h{k}"] = accuracy[k - 1]
            metrics[f"val/count/h{k}"] = total["counts"][k - 1]
            metrics[f"val/chain_acc/h{k}"] = chain[k - 1]
        for k, (covered, total_targets) in enumerate(total.get("draft_coverage", []), start=2):
            metrics[f"val/draft_vocab_coverage/h{k}"] = ratio(covered, total_targets)
        pl_module.log_dict({name: value.float() for name, value in metrics.items()}, on_epoch=True, sync_dist=False, batch_size=1)

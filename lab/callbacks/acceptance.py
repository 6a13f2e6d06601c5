"""Training-time acceptance: how often each draft horizon would be accepted, read during training without decoding.

Per horizon k ≥ 2, against the next-token path's distribution p at the row that predicts the same token
(lab/objective/readings.py):

    {train,val}/accept/h{k}   ᾱ_k = mean over rows of Σ_v min(p, q_k) = 1 − TV: acceptance at T = 1
    train/agree/h{k}          greedy agreement: top-1 of q_k = top-1 of p (validation's is val/agree/h{k},
                              lab/callbacks/agreement.py)
    {train,val}/tau           1 + Σ_{k≥2} Π_{j=2..k} ᾱ_j: expected tokens per target forward of a chain of
                              the run's heads at T = 1 (DeepSpec's estimate: per-position means, multiplied)
    train/kept/h{k}           objective.truncate=first_miss: the share of horizon k's supervised rows it kept

Train values come from the steps whose metrics reach the loggers (one extra projection per horizon, no
gradient, on those steps only); validation values from every validation batch. τ needs contiguous
offsets (a leap leaves draft slots no head fills). A DeepSeek depth is teacher-forced (it saw the true
tokens up to t+k−1, a decoder feeds it its drafts), so its α estimates from above.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from lab.callbacks.horizon_metrics import ratio
from lab.training.cadence import logs_this_step
from lab.training.step import step_outputs


def acceptance_metrics(sums: torch.Tensor, split: str, contiguous: bool, with_agreement: bool) -> dict[str, torch.Tensor]:
    """From [K, 3] (Σ α, Σ agreement, rows) per horizon: ᾱ_k, τ and (`with_agreement`) the greedy agreement under `split/`."""
    alpha, agree = ratio(sums[:, 0], sums[:, 2]), ratio(sums[:, 1], sums[:, 2])  # [K] each
    metrics, reach, tau = {}, torch.tensor(1.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    for k in range(2, sums.shape[0] + 1):
        metrics[f"{split}/accept/h{k}"] = alpha[k - 1]
        if with_agreement:
            metrics[f"{split}/agree/h{k}"] = agree[k - 1]
        reach = reach * alpha[k - 1]  # Π_{j=2..k} ᾱ_j
        tau = tau + reach
    if contiguous and sums.shape[0] > 1:
        metrics[f"{split}/tau"] = tau
    return metrics


class TrainingAcceptance(pl.Callback):
    def __init__(self):
        self._val: torch.Tensor | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = step_outputs(outputs)
        if step is None or not logs_this_step(trainer):
            return
        metrics = {}
        if step.acceptance is not None:
            metrics |= acceptance_metrics(step.acceptance, "train", pl_module.model.head_cfg.contiguous_offsets, with_agreement=True)
        if step.truncation is not None:
            for k, (kept, supervised) in enumerate(step.truncation[1:], start=2):
                metrics[f"train/kept/h{k}"] = ratio(kept, supervised)
        if metrics:
            pl_module.log_dict({name: value.float() for name, value in metrics.items()}, on_step=True, on_epoch=False, batch_size=1)

    def on_validation_epoch_start(self, trainer, pl_module):
        self._val = None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        sums = outputs.get("acceptance") if isinstance(outputs, dict) else None
        if sums is not None:
            self._val = sums.cpu() if self._val is None else self._val + sums.cpu()

    def on_validation_epoch_end(self, trainer, pl_module):
        if self._val is None or trainer.sanity_checking:
            return
        sums = pl_module.all_reduce_sum(self._val.to(pl_module.device)).cpu()
        metrics = acceptance_metrics(sums, "val", pl_module.model.head_cfg.contiguous_offsets, with_agreement=False)
        pl_module.log_dict({name: value.float() for name, value in metrics.items()}, on_epoch=True, sync_dist=False, batch_size=1)

"""Logit liveness each step: the logical figure of `logit_bytes` and the measured saved-tensor peak."""

import pytorch_lightning as pl
import torch

from lab.step import step_outputs


class LogitLiveness(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = step_outputs(outputs)
        if step is None:
            return
        metrics = {"mem/logits_live_bytes": float(step.logits_live_bytes), "mem/saved_peak_bytes": float(step.saved_peak_bytes)}
        if torch.cuda.is_available() and pl_module.device.type == "cuda":
            metrics["mem/cuda_peak_bytes"] = float(torch.cuda.max_memory_allocated(pl_module.device))
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

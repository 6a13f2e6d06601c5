"""Memory metrics, sampled: the logical `mem/logits_live_bytes` and the measured `mem/saved_peak_bytes`.

The saved-tensor meter hooks every tensor autograd saves, which costs Python work per tensor;
so it runs only at step 0 and every `every_n_steps` steps of the run, resumed or not (like the
gradient diagnostics), and ordinary steps pay nothing. On a measured step both numbers (plus the CUDA
allocator peak on GPU) go straight to every logger at the step they describe, and into the
callback metrics (run.json's final metrics). `every_n_steps` is `callbacks.liveness.every_n_steps`.
"""

import pytorch_lightning as pl
import torch

from lab.training.step import step_outputs
from lab.errors import require_int


class LogitLiveness(pl.Callback):
    def __init__(self, every_n_steps: int = 50):
        self.every_n_steps = every_n_steps

    def setup(self, trainer, pl_module, stage):
        require_int(self.every_n_steps, "callbacks.liveness.every_n_steps", least=1)
        pl_module.memory_every_n_steps = self.every_n_steps

    def teardown(self, trainer, pl_module, stage):
        pl_module.memory_every_n_steps = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = step_outputs(outputs)
        if step is None or step.saved_peak_bytes is None:
            return  # not a measured step
        metrics = {"mem/logits_live_bytes": float(step.logits_live_bytes), "mem/saved_peak_bytes": float(step.saved_peak_bytes)}
        if torch.cuda.is_available() and pl_module.device.type == "cuda":
            metrics["mem/cuda_peak_bytes"] = float(torch.cuda.max_memory_allocated(pl_module.device))
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        # Straight to the loggers at the step measured (Lightning would forward only its logging steps, and
        # would repeat a `self.log` value at later logging steps); into the callback metrics for run.json.
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.fit_loop.epoch_loop._batches_that_stepped)
        trainer.callback_metrics.update({name: torch.tensor(value) for name, value in metrics.items()})

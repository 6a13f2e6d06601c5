"""The progress bar: next-token loss, the objective (when it differs), tokens/s as `12.3k`, MFU, the latest validation loss.

Lightning's bar shows every `prog_bar=True` metric under its full name with four significant
digits (`train/tokens_per_s=1.23e+04`) and no validation loss once validation has passed. It
also reads every progress-bar metric back to the host (`.item()`) and redraws on every training
step; this one updates only on the steps whose metrics reach the loggers
(`trainer.log_every_n_steps`), so steps in between cost nothing.
"""

from __future__ import annotations

from pytorch_lightning.callbacks import TQDMProgressBar

from lab.training.cadence import logs_this_step

# logged metric → (label on the bar, format)
SHOWN = (
    ("train/loss", "loss", "{:.3f}"),
    ("train/objective", "obj", "{:.3f}"),
    ("val/loss", "val", "{:.3f}"),
    ("train/mfu", "mfu", "{:.1%}"),
)


def human_rate(value: float) -> str:
    """12345.6 → '12.3k', 2.5e6 → '2.50M', 950 → '950'."""
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


class TokenProgressBar(TQDMProgressBar):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if logs_this_step(trainer):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def get_metrics(self, trainer, pl_module) -> dict:
        logged = {**trainer.callback_metrics, **trainer.progress_bar_metrics}  # val/loss stays in callback_metrics
        items: dict = {}
        for name, label, pattern in SHOWN:
            if name in logged:
                items[label] = pattern.format(float(logged[name]))
        if items.get("obj") == items.get("loss"):  # next-token-only objective (ntp): one number is enough
            items.pop("obj", None)
        if "train/tokens_per_s" in logged:
            items["tok/s"] = human_rate(float(logged["train/tokens_per_s"]))
        if "mem/cuda_peak_bytes" in logged:
            items["cuda"] = f"{float(logged['mem/cuda_peak_bytes']) / 2**30:.1f}GiB"
        return items

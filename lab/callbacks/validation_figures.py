"""Validation figures: the per-horizon gradient cosine matrices and the per-horizon accuracy curve.

At the end of every validation (not the sanity check), on global rank 0:

- `horizon_acc`: validation top-1 accuracy and chain acceptance against the horizon k
  (from the `val/acc/h{k}` and `val/chain_acc/h{k}` values `HorizonMetrics` just logged);
- `grad_cos`: one K×K heatmap per gradient space (`leaf` = trunk output, then each
  parameter group) from the latest `GradDiagnostics` measurement (its step is in the
  title); skipped when no `GradDiagnostics` callback is configured or it has not run yet.

PNGs are written to `<run dir>/figures/{name}_step{global_step:06d}.png` (run dir =
`output_dir`, default `trainer.default_root_dir`). When a `WandbLogger` is configured the
same figures go to wandb as images (`val/fig/horizon_acc`, `val/fig/grad_cos`) with two
tables: `val/table/horizons` (k, loss, acc, chain_acc) and `val/table/grad_cos` (space, i,
j, cos). matplotlib is used through its object API (`Figure` + Agg canvas), so no global
backend is switched.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import WandbLogger

from lab.callbacks.grad_diagnostics import GradDiagnostics


def _value(metrics: dict, name: str) -> float:
    value = metrics.get(name)
    return float("nan") if value is None else float(value)


def horizon_table(metrics: dict, k: int) -> list[list[float]]:
    """Rows [k, val loss, val acc, val chain acceptance] from logged callback metrics."""
    return [[h, *(_value(metrics, f"val/{what}/h{h}") for what in ("loss", "acc", "chain_acc"))] for h in range(1, k + 1)]


def accuracy_figure(rows: list[list[float]], step: int):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.5, 3.2), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ks = [int(r[0]) for r in rows]
    ax.plot(ks, [r[2] for r in rows], marker="o", label="top-1 accuracy")
    ax.plot(ks, [r[3] for r in rows], marker="s", label="chain acceptance")
    ax.set_xlabel("horizon k")
    ax.set_ylabel("fraction")
    ax.set_xticks(ks)
    ax.set_ylim(0, 1)
    ax.set_title(f"validation, step {step}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def cosine_figure(cosines: dict[str, torch.Tensor], step: int):
    from matplotlib.figure import Figure

    spaces = list(cosines)
    cols = min(len(spaces), 4)
    rows = math.ceil(len(spaces) / cols)
    fig = Figure(figsize=(3.2 * cols, 3.0 * rows), dpi=100, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for ax, space in zip(axes.flat, spaces):
        matrix = cosines[space].double().numpy()
        k = matrix.shape[0]
        image = ax.imshow(matrix, vmin=-1, vmax=1, cmap="RdBu_r")
        labels = [f"h{h}" for h in range(1, k + 1)]
        ax.set_xticks(range(k), labels)
        ax.set_yticks(range(k), labels)
        ax.set_title(space if space != "leaf" else "leaf (trunk output)", fontsize=9)
        if k <= 8:
            for i in range(k):
                for j in range(k):
                    value = matrix[i, j]
                    color = "white" if not math.isnan(value) and abs(value) > 0.6 else "black"
                    text = "–" if math.isnan(value) else f"{value:.2f}"
                    ax.text(j, i, text, ha="center", va="center", fontsize=7, color=color)
    for ax in list(axes.flat)[len(spaces):]:
        ax.set_visible(False)
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="cosine")
    fig.suptitle(f"per-horizon gradient cosines, step {step}", fontsize=10)
    return fig


class ValidationFigures(pl.Callback):
    def __init__(self, output_dir: str | None = None, dpi: int = 100):
        self.output_dir = output_dir
        self.dpi = dpi
        self.written: list[Path] = []

    def figure_dir(self, trainer) -> Path:
        return Path(self.output_dir or trainer.default_root_dir) / "figures"

    def on_validation_end(self, trainer, pl_module):
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        step = trainer.global_step
        k = pl_module.model.k
        rows = horizon_table(trainer.callback_metrics, k)
        figures = {"horizon_acc": accuracy_figure(rows, step)}
        diagnostics = next((c for c in trainer.callbacks if isinstance(c, GradDiagnostics)), None)
        snapshot = diagnostics.latest if diagnostics is not None else None
        if snapshot is not None:
            figures["grad_cos"] = cosine_figure(snapshot.cosines, snapshot.step)
        out = self.figure_dir(trainer)
        out.mkdir(parents=True, exist_ok=True)
        paths = {}
        for name, fig in figures.items():
            paths[name] = out / f"{name}_step{step:06d}.png"
            fig.savefig(paths[name], dpi=self.dpi)
            self.written.append(paths[name])
        wandb_loggers = [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]
        for logger in wandb_loggers:
            for name, path in paths.items():
                logger.log_image(key=f"val/fig/{name}", images=[str(path)], step=step)
            logger.log_table(key="val/table/horizons", columns=["k", "loss", "acc", "chain_acc"], data=rows, step=step)
            if snapshot is not None:
                data = [
                    [space, i + 1, j + 1, float(cos[i, j])]
                    for space, cos in snapshot.cosines.items()
                    for i in range(cos.shape[0])
                    for j in range(cos.shape[1])
                ]
                logger.log_table(key="val/table/grad_cos", columns=["space", "i", "j", "cos"], data=data, step=step)

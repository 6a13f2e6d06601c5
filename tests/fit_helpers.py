"""In-process training on the real config: compose `conf/` with Hydra, `build()`, fit with a real Trainer."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
from hydra import compose, initialize_config_dir
from pytorch_lightning.callbacks import ModelCheckpoint

from lab.checkpoint.io import SafeCheckpointIO
from lab.train import CONF_DIR, build
from tests.cli import TINY


def compose_cfg(*overrides: str, cache_dir: Path):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=[*TINY, f"paths.cache_dir={cache_dir}", *overrides])


def make_trainer(run_dir: Path, *, max_steps: int, every: int = 2, callbacks=(), precision: str = "32-true") -> pl.Trainer:
    """A real CPU Trainer without loggers or validation; checkpoints every `every` steps into run_dir/checkpoints."""
    checkpoint = ModelCheckpoint(dirpath=Path(run_dir) / "checkpoints", save_last=True, save_top_k=0, every_n_train_steps=every)
    return pl.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, logger=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0, deterministic=True,
        callbacks=[*callbacks, checkpoint], plugins=[SafeCheckpointIO()], precision=precision,
    )


def fit(cfg, run_dir: Path, *, max_steps: int, every: int = 2, ckpt_path=None, callbacks=(), precision=None):
    """(trainer, module, datamodule) after `max_steps` steps; checkpoints every `every` steps into run_dir/checkpoints.

    `precision` defaults to the composed config's `trainer.precision`.
    """
    datamodule, module = build(cfg)
    trainer = make_trainer(run_dir, max_steps=max_steps, every=every, callbacks=callbacks, precision=precision or cfg.trainer.precision)
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    return trainer, module, datamodule


def searchpath_with(folder: Path, group: str, option: str, yaml_text: str) -> str:
    """A config folder under `folder` holding `<group>/<option>.yaml`, as the `hydra.searchpath` override that adds it
    (conf/ stays the primary): how a user's own option outside conf/ reaches the composed config."""
    (folder / "conf" / group).mkdir(parents=True)
    (folder / "conf" / group / f"{option}.yaml").write_text(yaml_text)
    return f"hydra.searchpath=[file://{folder / 'conf'}]"


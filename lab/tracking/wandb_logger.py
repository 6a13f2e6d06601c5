"""Lightning's WandbLogger with the run's whole resolved config as the wandb run config.

Lightning would log the LightningModule's and the DataModule's hyperparameters: the module's
sit under their group names but the DataModule's land at top level without a prefix
(`seq_len`, `batch_size`) and the trainer settings are missing. Here the wandb config is the
resolved Hydra config with its group prefixes (`data.seq_len`, `trainer.max_steps`,
`head.k`, ...) plus `sweep_name`, `run_dir` and the job's `overrides`, so wandb's own
"group by" and filters work on any setting.
"""

from __future__ import annotations

from typing import Any

from pytorch_lightning.loggers import WandbLogger as LightningWandbLogger
from pytorch_lightning.utilities import rank_zero_only


# run.json fields lab/train.py passes to `log_hyperparams`: the wandb run config carries them for reports read from wandb.
LOGGED_RECORD_FIELDS = ("cost", "k", "head_traits", "corpus_stats", "numerics")


class WandbLogger(LightningWandbLogger):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Lightning always passes `anonymous`, which wandb ≥ 0.19 answers with a warning on every run.
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        """Lightning's module/datamodule hyperparameters are replaced by `log_run_config`; the
        harness's own record fields (`LOGGED_RECORD_FIELDS`, lab/train.py) join the run config, where reports read them."""
        if isinstance(params, dict) and set(params) == set(LOGGED_RECORD_FIELDS):
            self.experiment.config.update(params, allow_val_change=True)

    @rank_zero_only  # other DDP ranks have no wandb run
    def log_run_config(self, config: dict, *, run_dir: str, overrides: list[str], sweep_name: str | None) -> None:
        """The resolved config (nested: wandb shows and filters it as `data.seq_len`, ...) plus run identity."""
        payload = {key: value for key, value in config.items() if key not in ("run_dir", "overrides")}
        payload.update(run_dir=run_dir, overrides=list(overrides), sweep_name=sweep_name)
        self.experiment.config.update(payload, allow_val_change=True)

"""`SingleJobArgv`: multi-process (DDP) jobs inside a Hydra sweep (registered in conf/hydra/default.yaml).

Lightning's `ddp` strategy starts ranks 1..N-1 by re-running `sys.argv` (plus
`hydra.run.dir=<run dir>`); inside a multirun that argv still holds `-m` and the sweep
lists, so every rank would launch the whole sweep again. While a job runs, this callback
replaces `sys.argv` with that job's own overrides and `hydra.mode=RUN`, and points
`hydra.run.dir` at the job's directory, so the extra ranks run exactly this job, in this
job's directory.
"""

from __future__ import annotations

import sys
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, read_write


def is_multirun() -> bool:
    try:
        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:
        return False


class SingleJobArgv(Callback):
    def __init__(self) -> None:
        self._saved_argv: list[str] | None = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not is_multirun():
            return
        hydra_cfg = HydraConfig.get()
        self._saved_argv = list(sys.argv)
        overrides = [str(o) for o in OmegaConf.to_container(hydra_cfg.overrides.task)]
        sys.argv = [sys.argv[0], *overrides, "hydra.mode=RUN"]
        with read_write(hydra_cfg.run):
            hydra_cfg.run.dir = hydra_cfg.runtime.output_dir

    def on_job_end(self, config: DictConfig, job_return: Any = None, **kwargs: Any) -> None:
        if self._saved_argv is not None:
            sys.argv = self._saved_argv
            self._saved_argv = None

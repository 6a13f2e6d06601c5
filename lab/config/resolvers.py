"""OmegaConf resolvers the configs use (registered by `lab-train` before Hydra composes).

`${lab.aux_lambdas:LAMBDA,GAMMA,K}` → [1, λ, λγ, λγ², …] (K entries): the next-token loss keeps
weight 1, horizon 2 weighs λ relative to it and every further horizon γ times the one before.
It lets a search (experiments/search_lambda.yaml) tune two numbers instead of a K-long list.

`${lab.wandb_dir:}` → where a job's offline wandb run goes: the sweep directory in a multirun
(so `wandb sync <sweep dir>/wandb/offline-run-*` finds every job and the report run), the run
directory otherwise.

`${lab.sweep_jobs:ACCELERATOR}` → how many jobs the parallel launcher runs side by side: one per usable
core on CPU, one at a time on an accelerator (conf/hydra/launcher/parallel.yaml; each small job computes
on one thread, lab/training/threads.py).
"""

from __future__ import annotations

from omegaconf import OmegaConf


def aux_lambdas(lam: float, gamma: float, k: int) -> list[float]:
    return [1.0] + [float(lam) * float(gamma) ** (j - 2) for j in range(2, int(k) + 1)]


def wandb_dir() -> str:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    return str(hydra_cfg.sweep.dir if hydra_cfg.mode == RunMode.MULTIRUN else hydra_cfg.runtime.output_dir)


def sweep_jobs(accelerator: str = "cpu") -> int:
    from lab.training.threads import sweep_jobs_side_by_side

    return sweep_jobs_side_by_side() if str(accelerator) == "cpu" else 1


def register_resolvers() -> None:
    """Idempotent; also called inside each job (a joblib worker process starts without them)."""
    OmegaConf.register_new_resolver("lab.aux_lambdas", aux_lambdas, replace=True)
    OmegaConf.register_new_resolver("lab.wandb_dir", wandb_dir, replace=True)
    OmegaConf.register_new_resolver("lab.sweep_jobs", sweep_jobs, replace=True)

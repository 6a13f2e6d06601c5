"""`lab-train --help`: usage, config groups with their options, experiments; read from conf/ directly.

Hydra's own `--help` composes the config and walks every config group of every installed
plugin (seconds on a 2-core machine); this answers from the file tree in well under a second.
Hydra's help stays available as `lab-train --hydra-help`, the composed config as `--cfg job`.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from lab.config.checks import available_options
from lab.config.preflight import experiment_listing

USAGE = """lab-train: train one multi-token-prediction run, or a sweep of them (Hydra multirun), and record it
(run.json, metrics.csv, checkpoints, an offline wandb run; a sweep also writes its report).

usage: lab-train [-m] [GROUP=OPTION ...] [KEY=VALUE ...] [hydra.run.dir=DIR | hydra.sweep.dir=DIR]

  lab-train head=parallel head.k=4 trainer.max_steps=200     one run
  lab-train -m head=parallel,causal seed=0,1,2                a sweep (comma-separated values)
  lab-train experiment=quick_ablation                         a shipped sweep (experiment= lists them)
  lab-train debug=fast                                        a 5-step smoke run
  lab-train hydra.run.dir=DIR ckpt_path=last                  resume a run (lab-resume SWEEP_DIR: a sweep)
"""
FLAGS = """flags:
  -m, --multirun   sweep over comma-separated values
  --cfg job        print the composed config and exit (--resolve to resolve interpolations)
  --hydra-help     Hydra's own help (its config groups and flags)"""


def default_choices(conf_dir: Path) -> dict[str, str]:
    """group → its default option, from the defaults list of conf/train.yaml."""
    entries = (yaml.safe_load((conf_dir / "train.yaml").read_text()) or {}).get("defaults", [])
    return {key: str(value) for entry in entries if isinstance(entry, dict) for key, value in entry.items()}


def help_text(conf_dir: Path) -> str:
    defaults = default_choices(conf_dir)
    groups = [g for g in defaults if g not in ("hydra", "experiment") and (conf_dir / g).is_dir()]
    lines = [USAGE, "config groups (GROUP=OPTION; * = default; any field: GROUP.FIELD=VALUE):"]
    for group in groups:
        options = [f"{o}*" if o == defaults.get(group) else o for o in available_options(conf_dir, group)]
        lines.append(f"  {group + ':':<16}{', '.join(options)}")
    lines += ["", experiment_listing(conf_dir), "", FLAGS]
    return "\n".join(lines)

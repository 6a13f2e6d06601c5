"""A resume continues the run it resumes: a config that would train differently is refused in one line.

Resuming a killed run with another `optim.lr` trained on at the new rate while run.json showed the new
rate for the steps already taken too. A resume (`ckpt_path=last`, or a checkpoint of the run's own
folder) is compared with the config run.json recorded for the run's latest attempt, setting by setting;
the first difference outside `RESUMABLE` is refused naming the setting, both values and how to get
either. What a resume may change: how long it trains, how it is evaluated, logged and shown, and the
machine-side settings that leave every step's numbers as they were.
"""

from __future__ import annotations

from lab.errors import ConfigError

# Dotted settings (or prefixes ending in ".") a resume may change.
RESUMABLE = (
    "trainer.max_steps", "trainer.val_check_interval", "trainer.check_val_every_n_epoch", "trainer.limit_val_batches",
    "trainer.num_sanity_val_steps", "trainer.log_every_n_steps", "trainer.enable_progress_bar", "trainer.enable_model_summary",
    "trainer.default_root_dir", "trainer.threads", "callbacks.", "logger.", "report.", "paths.", "tags", "sweep_name",
    "run_name", "ckpt_path", "variants.", "hidden_cache", "data.num_workers", "data.num_proc", "data.cache_dir",
)


def flat(node, prefix: str = "") -> dict[str, object]:
    """{dotted key: leaf value} of a nested mapping (lists are leaves)."""
    if not isinstance(node, dict) or not node:
        return {prefix.rstrip("."): node}
    out = {}
    for key, value in node.items():
        out.update(flat(value, f"{prefix}{key}."))
    return out


def may_change(key: str) -> bool:
    return any(key == allowed or (allowed.endswith(".") and key.startswith(allowed)) for allowed in RESUMABLE)


def check_resume_config(recorded: dict | None, config: dict) -> None:
    """`config` (resolved) against the config run.json `recorded` for the run being resumed (None: nothing recorded)."""
    if not recorded:
        return
    before, now = flat(recorded), flat(config)
    for key in sorted(before.keys() | now.keys()):
        if may_change(key) or before.get(key) == now.get(key):
            continue
        raise ConfigError(key, f"the run being resumed trained with {before.get(key, '(unset)')!r}, this resume gives "
                               f"{now.get(key, '(unset)')!r}; a resume continues the run as it was (only the step count, "
                               "evaluation, logging and callbacks may change): resume with its own value, or start a new "
                               "run from its weights with init_from=<its run dir> in another hydra.run.dir")

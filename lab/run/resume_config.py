"""A resume continues the run it resumes: a config that would train differently is refused in one line.

Resuming a killed run with another `optim.lr` trained on at the new rate while run.json showed the new
rate for the steps already taken too. A resume (`ckpt_path=last`, or a checkpoint of the run's own
folder) is compared with the config run.json recorded for the run's latest attempt, setting by setting,
over the groups that decide what a step computes (`COMPARED`; an experiment's lookup tables such as
`variants` or `presets` feed them, so a change that matters shows there); the first difference outside
`RESUMABLE` is refused naming the setting and both values. What a resume may change: how long it trains
(`trainer.max_steps`, which also stretches the learning-rate and λ schedules over the new length), how it
is evaluated, logged and shown, and the machine-side settings that leave every step's numbers as they were.
A key only one side has (a setting a code update added or removed) is not a change the user made; a
setting the run noted as changing nothing (a sweep job's `unused_settings`) may be given again.
"""

from __future__ import annotations

from pathlib import Path

from lab.errors import ConfigError

# Dotted prefixes of the settings that decide what a training step computes.
COMPARED = ("model.", "head.", "data.", "optim.", "objective.", "reduction.", "weights.", "schedule.", "train_rows.", "trainer.",
            "seed", "init_from")
# Dotted settings (or prefixes ending in ".") among them that a resume may change.
RESUMABLE = (
    "trainer.max_steps", "trainer.max_epochs", "trainer.val_check_interval", "trainer.check_val_every_n_epoch",
    "trainer.limit_val_batches", "trainer.num_sanity_val_steps", "trainer.log_every_n_steps", "trainer.enable_progress_bar",
    "trainer.enable_model_summary", "trainer.default_root_dir",
    "trainer.threads",  # a resume computes on the recorded count whatever is given, or is refused (lab/training/threads.py)
    "data.num_workers", "data.num_proc",
    "data.cache_dir",
)


def flat(node, prefix: str = "") -> dict[str, object]:
    """{dotted key: leaf value} of a nested mapping (lists are leaves)."""
    if not isinstance(node, dict) or not node:
        return {prefix.rstrip("."): node}
    out = {}
    for key, value in node.items():
        out.update(flat(value, f"{prefix}{key}."))
    return out


def matches(key: str, prefixes) -> bool:
    return any(key == prefix or (prefix.endswith(".") and key.startswith(prefix)) for prefix in prefixes)


def check_resume_config(previous: dict | None, config: dict) -> None:
    """`config` (resolved) against the run record `previous` of the run being resumed (None: nothing recorded)."""
    recorded = (previous or {}).get("config")
    if not recorded:
        return
    noted = {entry["field"]: [entry.get("value"), entry.get("runs_as")] for entry in previous.get("unused_settings") or []}
    before, now = flat(recorded), flat(config)
    for key in sorted(before.keys() & now.keys()):
        if not matches(key, COMPARED) or matches(key, RESUMABLE) or before[key] == now[key] or now[key] in noted.get(key, ()):
            continue
        raise ConfigError(key, f"the run being resumed trained with {before[key]!r}, this resume gives {now[key]!r}; a resume "
                               "continues the run as it was (only the step count, evaluation, logging and callbacks may change): "
                               "resume with its own value, or start a new run from its weights with init_from=<its run dir> in "
                               "another hydra.run.dir")


def resumes_own_checkpoint(ckpt_path, run_dir: Path) -> bool:
    """`ckpt_path=last` with a last.ckpt, or a checkpoint inside this run's folder: the attempt continues this run."""
    if ckpt_path is None:
        return False
    ckpt = run_dir / "checkpoints" / "last.ckpt" if ckpt_path == "last" else Path(str(ckpt_path))
    return ckpt.exists() and ckpt.resolve().is_relative_to(run_dir.resolve())

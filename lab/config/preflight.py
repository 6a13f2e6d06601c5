"""`lab-train`'s command-line checks before Hydra starts a job (nothing is written before them).

Hydra reports a misspelt key as "Key 'max_step' is not in struct" with a traceback, a `null`
group choice as a ValueError, and lets `head.k=abc` through to fail deep inside training.
Here the overrides are checked against the composed default config first and every problem
becomes one line `error: <field>: <what is allowed>` (with a "did you mean" when a name is
close to a real one). Sweep lists (`head.k=2,4`) are checked value by value.
"""

from __future__ import annotations

import re

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lab.config.checks import check_group_choice
from lab.config.target_nodes import SCALAR_NAMES, fits
from lab.errors import ConfigError
from lab.schema import check_known

FLAGS_WITHOUT_CHECKS = ("-m", "--multirun")  # other flags (--help, --cfg, ...) go to Hydra untouched


def config_groups(conf_dir: Path) -> list[str]:
    return sorted(p.name for p in conf_dir.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def is_group_key(key: str, conf_dir: Path) -> bool:
    return "/" in key or (("." not in key) and (conf_dir / key).is_dir())


def experiment_descriptions(conf_dir: Path) -> list[tuple[str, str]]:
    """(name, first sentence of the header comment) for every experiments/<name>.yaml."""
    out = []
    for path in sorted((conf_dir / "experiment").glob("*.yaml")):
        prose = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            text = line.lstrip("#").strip()
            if text.startswith(("@package", "lab-train")):
                continue
            if not text and prose:
                break
            if text:
                prose.append(text)
        out.append((path.stem, one_line(" ".join(prose))))
    return out


def one_line(paragraph: str, width: int = 100) -> str:
    """The paragraph's first clause (up to '. ' or '; '), cut at a word boundary to `width` characters."""
    clause = paragraph.split(". ")[0].split("; ")[0].rstrip(".")
    if len(clause) > width:
        clause = clause[: width - 1].rsplit(" ", 1)[0] + "…"
    return clause


def experiment_listing(conf_dir: Path) -> str:
    rows = experiment_descriptions(conf_dir)
    width = max((len(name) for name, _ in rows), default=0)
    lines = ["experiments (lab-train experiment=NAME; files in experiments/):"]
    lines += [f"  {name:<{width}}  {description}" for name, description in rows]
    return "\n".join(lines)


def parse(argv: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides([a for a in argv if a not in FLAGS_WITHOUT_CHECKS])
    except Exception as error:  # Hydra's grammar error: name the argument, not the parser state
        raise ConfigError("command line", f"cannot parse the overrides ({str(error).splitlines()[0]})") from None


def values_of(override) -> list:
    """The value(s) of one override; a sweep gives its elements, an interval sweep (Optuna) none."""
    if override.is_sweep_override():
        try:
            return list(override.sweep_iterator())
        except Exception:
            return []  # interval(...) and other continuous sweeps: nothing discrete to check
    return [override.value()]


def compose(conf_dir: Path, overrides: list[str], with_hydra: bool = False) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            return hydra_compose("train", overrides=overrides, return_hydra_config=with_hydra)
    except Exception as error:  # a group file that does not compose: Hydra's own first line, or its cause's
        raise composition_error(error) from None


# Hydra plugin configs that an optional extra installs: (the setting that selects it, what to install).
OPTIONAL_PLUGINS = {"hydra/sweeper/optuna": ("hparams_search", "optuna needs Hydra's Optuna sweeper, which is not installed: "
                                                                 "pip install 'mtp-lab[search]' (optuna 2.x and the SQLAlchemy 1.x it needs)")}


def composition_error(error: Exception) -> ConfigError:
    """One line for a config Hydra cannot compose: the key and the reason OmegaConf gives (`head.draft_vocab=ten`:
    the schema's type), a missing optional plugin and its extra, else Hydra's own first line."""
    missing = re.search(r"Could not find '([^']+)'", str(error))
    if missing is not None and missing.group(1) in OPTIONAL_PLUGINS:
        return ConfigError(*OPTIONAL_PLUGINS[missing.group(1)])
    cause = error.__cause__
    detail = str(cause or "")
    key = re.search(r"full_key: (\S+)", detail)
    if key is not None:
        reason = detail.strip().splitlines()[0]
        return ConfigError(key.group(1), reason[:1].lower() + reason[1:])
    return ConfigError("command line", str(error).strip().splitlines()[0])


CHECKED_TYPES = (bool, int, float)  # a default's type that an override must keep (strings take anything)


def type_error(expected, value) -> str | None:
    """Why `value` cannot stand where the default config has a value of type `expected` (None: fine)."""
    if value is None or expected not in CHECKED_TYPES or fits(expected, value):
        return None
    return f"must be {SCALAR_NAMES[expected]}, got {value!r}"


def check_value_override(override, base: DictConfig, conf_dir: Path) -> None:
    key = override.key_or_group
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(base, parent) if parent else base
    exists = isinstance(node, DictConfig) and leaf in node.keys()  # `in node` is False for a `???` value
    if not exists:
        if override.is_delete() or ((override.is_add() or override.is_force_add()) and parent):
            return  # a new key inside a group: the group's schema or its class checks it
        if override.is_add() or override.is_force_add():
            refuse_new_top_level_key(leaf, [str(k) for k in base.keys()] + config_groups(conf_dir))
        candidates = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
        check_known(parent, [leaf], candidates + ([] if parent else config_groups(conf_dir)))
    if override.is_delete():
        return
    default = OmegaConf.to_container(node, resolve=False)[leaf] if isinstance(node, DictConfig) else None
    if isinstance(default, str) and default.startswith("${"):
        try:
            default = OmegaConf.select(base, key)  # an interpolation: its resolved value's type
        except Exception:
            return
    for value in values_of(override):
        problem = type_error(type(default), value)
        if problem:
            raise ConfigError(key, problem)


def refuse_new_top_level_key(key: str, known: list[str]) -> None:
    """`+foo=1`: a top-level key no part of the run reads (each group checks the keys added inside it)."""
    from lab.schema import did_you_mean

    raise ConfigError(key, f"a new top-level key, which no part of the run reads{did_you_mean(key, known, '')}; "
                           "settings live in their groups (lab-train --help lists them)")


def search_folders(searchpath) -> tuple[Path, ...]:
    """The local folders of `hydra.searchpath=[file:///…, …]` overrides (a `pkg://` entry is Hydra's to read)."""
    entries = [str(entry) for override in searchpath for entry in (override.value() or [])]
    return tuple(Path(entry.removeprefix("file://")) for entry in entries if entry.startswith("file://"))


def preflight(argv: list[str], conf_dir: Path) -> DictConfig | None:
    """Check every override; return the composed config (first value of every sweep), or None
    when flags other than -m are given (help, --cfg, shell completion: Hydra answers those)."""
    if any(a.startswith("-") and a not in FLAGS_WITHOUT_CHECKS for a in argv):
        return None
    overrides = parse(argv)
    searchpath = [o for o in overrides if o.key_or_group == "hydra.searchpath"]  # a user's config folders beside conf/
    search_dirs = search_folders(searchpath)
    groups, values = [], []
    for override in overrides:
        key = override.key_or_group
        if override.is_hydra_override() or key.startswith("hydra/"):
            continue
        if is_group_key(key, conf_dir) and not override.is_delete():
            choices = [str(v) if v is not None else "null" for v in values_of(override)] or ["null"]
            if "/" not in key:
                check_group_choice(key, choices, conf_dir, search_dirs)
            groups.append((override, choices))
        else:
            values.append(override)
    group_args = [o.input_line for o in searchpath]
    group_args += [f"{o.get_key_element()}={choices[0]}" for o, choices in groups if choices[0] not in ("null", "None", "")]
    base = compose(conf_dir, group_args)
    for override in values:
        check_value_override(override, base, conf_dir)
    first_job = [line for line in (first_job_override(o) for o in overrides) if line is not None]
    full = compose(conf_dir, first_job, with_hydra=True)
    check_required_values(full)
    if "-m" in argv or "--multirun" in argv or str(full.hydra.mode) == "RunMode.MULTIRUN":
        check_sweep_launcher(full)
        return full  # each job validates itself; a failed job is recorded and the sweep goes on
    check_single_run(full)
    return full


def check_sweep_launcher(cfg: DictConfig) -> None:
    """Jobs side by side (the parallel launcher, conf/hydra/launcher/parallel.yaml) run in joblib's worker processes,
    which cannot start a multi-process job's other ranks: such a sweep takes the basic launcher, one job at a time."""
    launcher = str(OmegaConf.select(cfg, "hydra.launcher._target_", default=""))
    trainer = cfg.trainer
    strategy = trainer.get("strategy")
    multi_process = str(trainer.get("devices")) not in ("1", "auto") or (strategy != "auto" and strategy is not None)
    if "joblib" in launcher.lower() and multi_process:
        raise ConfigError("hydra/launcher", f"a sweep of multi-process jobs (trainer.devices={trainer.get('devices')}, a "
                                            "distributed strategy) runs one job at a time: add hydra/launcher=basic (joblib's "
                                            "workers, which run jobs side by side, cannot start a job's other ranks)")


def check_required_values(cfg: DictConfig) -> None:
    """A value the config marks `???` (e.g. draft_training's `parent`) must come from the command line."""
    missing = [key for key in missing_values(cfg) if not key.startswith("hydra.")]
    if missing:
        raise ConfigError(missing[0], f"must be set on the command line ({missing[0]}=...); the config leaves it open (???)")


def missing_values(node: DictConfig, prefix: str = ""):
    """Keys whose value is `???`, without resolving interpolations (Hydra's own node has unset runtime fields)."""
    for key in node.keys():
        if OmegaConf.is_missing(node, key):
            yield f"{prefix}{key}"
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig) and f"{prefix}{key}" != "hydra":
            yield from missing_values(child, f"{prefix}{key}.")


def first_job_override(override) -> str | None:
    """The override as it applies to the first job of a sweep (None: leave it to Hydra)."""
    if override.is_delete():
        return override.input_line
    if not override.is_sweep_override():
        return f"{override.get_key_element()}={override.get_value_element_as_str()}"
    try:
        return f"{override.get_key_element()}={next(iter(override.sweep_string_iterator()))}"
    except Exception:
        return None  # interval(...) for Optuna


def check_single_run(cfg: DictConfig) -> None:
    """Every check a single run can make before Hydra makes the run folder: the config (the same
    `check_config` the build runs first) and the files it names (parent weights, checkpoint)."""
    from lab.config.checks import check_config
    from lab.config.unused import noted_unused_settings

    resuming = cfg.ckpt_path == "last" and OmegaConf.select(cfg, "hydra.run.dir") is not None
    check_config(cfg, noted_unused_settings(Path(str(cfg.hydra.run.dir))) if resuming else frozenset())
    if cfg.get("init_from"):
        from lab.release.init_from import check_parent

        check_parent(str(cfg.init_from))  # a missing or damaged parent: one line now (its vocabulary is checked at build)
    if cfg.ckpt_path not in (None, "last"):
        from lab.checkpoint import load_checkpoint

        load_checkpoint(cfg.ckpt_path)  # damaged or unsafe file: one line now, not after the run dir is made

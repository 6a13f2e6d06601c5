"""Start-up checks that belong to no single config group: group choices, run settings, K vs seq_len.

Every group checks its own fields once, when it is built into a typed object
(`LMDataModule`, `build_model`, `Objective.build`, `OptimConfig`).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lab.config.target_nodes import check_target_nodes
from lab.errors import ConfigError, is_int, require, require_bool, require_int
from lab.schema import did_you_mean, typed

# Lightning's precision strings (plus its short aliases); transformer-engine needs NVIDIA's package.
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "32", "16", "bf16", "64")
GPU_ACCELERATORS = ("gpu", "cuda")


def available_options(conf_dir: Path, group: str, search_dirs: tuple[Path, ...] = ()) -> list[str]:
    """The options of `group`: conf/<group>/*.yaml, the same in the folders a `hydra.searchpath` adds, and the entries
    a plugin stored in Hydra's ConfigStore (the `*schema` nodes are the harness's own typing, not options)."""
    from hydra.core.config_store import ConfigStore

    files = {p.stem for folder in (conf_dir, *search_dirs) for p in (folder / group).glob("*.yaml")}
    stored = {name.removesuffix(".yaml") for name in ConfigStore.instance().repo.get(group, {}) if name.endswith(".yaml")}
    return sorted(files | {name for name in stored if not name.endswith("schema")})


OPTIONAL_GROUPS = ("experiment", "hparams_search", "debug")  # default null in conf/train.yaml


def check_group_choice(key: str, choices: list[str], conf_dir: Path, search_dirs: tuple[Path, ...] = ()) -> None:
    """Each choice of group `key` names one of its options (`available_options`; null only for optional groups)."""
    options = available_options(conf_dir, key, search_dirs)
    for choice in choices:
        if choice in ("", "null"):
            if key in OPTIONAL_GROUPS:
                continue
            hint = f" (use {key}=none to turn it off)" if "none" in options else ""
            raise ConfigError(key, f"null is not an option{hint}; allowed: {', '.join(options)}")
        if choice not in options:
            raise ConfigError(key, f"unknown option '{choice}'{did_you_mean(choice, options)}; allowed: {', '.join(options)}")


def check_config(cfg: DictConfig, noted: frozenset[str] = frozenset()) -> "CheckedGroups":
    """Every check of a run's config that needs no data and no weights, in one sequence: the run
    settings, then each group through the typed config it is built from (each field checked by its
    group's schema), then the invariants across groups. `lab-train`'s pre-flight and `build` call it.
    `noted`: settings that change nothing which this run already noted (a resumed sweep job's), not refused."""
    from lab.data import check_data_config
    from lab.model.compile import split_compile_option
    from lab.config.unused import refuse_unused, unused_settings
    from lab.model.mtp import check_head_on_trunk, model_config
    from lab.model.trunks import trunk_spec
    from lab.objective.objective import Objective
    from lab.training.checked_groups import CheckedGroups
    from lab.data.train_rows import TrainRowsConfig
    from lab.training.optim import OptimConfig

    def plain(group: str) -> dict:
        return OmegaConf.to_container(cfg[group], resolve=True)

    check_run_config(cfg)
    for group in TARGET_GROUPS:
        check_target_nodes(cfg, group)
    check_decoding_options_of(cfg.get("callbacks"))
    check_humaneval_options_of(cfg.get("callbacks"), OmegaConf.select(cfg, "data.source"))
    data = check_data_config(plain("data"))  # local files: exist and are not empty
    model, _ = split_compile_option(plain("model"))
    head = typed_head(cfg)
    check_future_horizons(head)
    if not in_sweep_job():  # a sweep job noted them and set them to their defaults (lab.train.settle_unused_settings)
        refuse_unused([setting for setting in unused_settings(cfg, head) if setting.field not in noted])
    spec = trunk_spec(model)
    trunk = model_config(spec.fill_vocab_size(model, 256))  # the tokenizer sets it later; any size checks the rest
    check_head_on_trunk(trunk, head)  # compute matching, head.block, head.init, lora vs the trunk family
    check_decoding_callback(cfg.get("callbacks"), spec.preflight(trunk, head))  # config, tokenizer, LoRA targets: no weights
    optim = typed(OptimConfig, plain("optim"), "optim")
    targets = OmegaConf.to_container(cfg.objective, resolve=True) if cfg.get("objective") is not None else None
    objective = Objective.build(plain("reduction"), plain("weights"), plain("schedule"), k=head.k, objective=targets)
    require(not (targets or {}).get("teacherless") or hasattr(data, "task"), "objective.teacherless",
            f"needs a synthetic task (data=star_graph|induction), the only data with answers; got data.source={cfg.data.get('source')}")
    check_horizons_fit(head.k, data.seq_len, head.offsets, "head.rollout_steps" if getattr(head, "rollout", None) == "self" else "head.k")
    check_hidden_cache(cfg, head.trunk_grad)
    train_rows = typed(TrainRowsConfig, plain("train_rows") if cfg.get("train_rows") is not None else {}, "train_rows")
    check_train_rows(train_rows, data, trained_weights_of(model, cfg.get("init_from")))
    return CheckedGroups(head=head, optim=optim, objective=objective, train_rows=train_rows)


def in_sweep_job() -> bool:
    """Whether this process runs a job of a Hydra multirun (the job's own config is being built)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def typed_head(cfg: DictConfig):
    """The run's head config, typed by its class (K and the defaults the trunk gives it filled in)."""
    from lab.model.compile import split_compile_option
    from lab.model.heads import head_config
    from lab.model.mtp import head_defaults_for

    model, _ = split_compile_option(OmegaConf.to_container(cfg.model, resolve=True))
    return head_config(head_defaults_for(model, OmegaConf.to_container(cfg.head, resolve=True)))


def check_future_horizons(head) -> None:
    """A multi-token head (every head but the registry's baseline) needs a horizon beyond the next token."""
    from lab.model.heads import HEAD_SPECS

    require(head.k >= 2 or HEAD_SPECS[head.name].is_baseline, "head.k",
            f"head '{head.name}' with k={head.k} predicts only the next token, which is the baseline's job; "
            f"allowed: an integer ≥ 2 (or head={next(s.name for s in HEAD_SPECS.values() if s.is_baseline)})")


# Groups of `_target_` nodes, checked against their classes' signatures (lab/config/target_nodes.py).
TARGET_GROUPS = ("trainer", "callbacks", "logger")

# Precisions under which a live step computes the trunk's states as the cache does (no autocast, no cast model).
CACHE_PRECISIONS = ("32-true", "32")


def check_hidden_cache(cfg: DictConfig, trunk_grad: str) -> None:
    """`hidden_cache=true` replaces the trunk's run by stored states: only for a trunk that never changes,
    on indexed rows, at the precision the states were computed in."""
    enabled = cfg.get("hidden_cache", False)
    require_bool(enabled, "hidden_cache")
    if not enabled:
        return
    require(trunk_grad == "frozen", "hidden_cache",
            f"stores the states of a trunk that never changes; needs head.trunk_grad=frozen, got {trunk_grad}")
    require(not cfg.data.get("streaming", False), "hidden_cache",
            "caches an indexed training split row by row; data.streaming=true has none (set data.streaming=false)")
    precision = str(cfg.trainer.get("precision", "32-true"))
    require(precision in CACHE_PRECISIONS, "hidden_cache",
            f"trainer.precision={precision} would compute the live trunk differently from the cache; allowed: "
            f"{', '.join(CACHE_PRECISIONS)} (for bfloat16 set model.dtype=bfloat16: the cache then holds bfloat16 states)")


def trained_weights_of(model: dict, init_from) -> str | None:
    """Where the trunk's weights come from when they are trained ones (None: a random initialisation)."""
    from lab.model.trunks import trunk_spec

    return f"init_from={init_from}" if init_from else trunk_spec(model).trained_weights(model)


def check_train_rows(train_rows, data, trained_weights: str | None) -> None:
    """`train_rows=generated` continues each packed corpus row after its prompt: a text corpus on indexed rows,
    with room in every row for the model to write, written by a trunk that has learned something (pretrained or
    init_from): a random one would write noise for hours and train the run on it."""
    if train_rows.source != "generated":
        return
    require(not hasattr(data, "task"), "train_rows",
            f"generated rows continue a text corpus; data.source={data.source} is a synthetic task with its own answers (set train_rows=corpus)")
    require(not data.streaming, "train_rows", "generated rows replace an indexed training split row by row; set data.streaming=false")
    require(train_rows.prompt_tokens < data.seq_len, "train_rows.prompt_tokens",
            f"must be below data.seq_len={data.seq_len} so the model writes part of each row, got {train_rows.prompt_tokens}")
    require(trained_weights is not None, "train_rows",
            "generated rows are the model's own continuations, and this trunk starts from random weights (they would be "
            "noise); use a pretrained trunk (model=hf model.path=..., model=smollm2) or init_from=<a trained run>, or train_rows=corpus")


def check_decoding_options_of(callbacks) -> None:
    """`callbacks.decoding`'s option ranges (the callback's own rules), before the run folder exists."""
    from lab.callbacks.decoding import check_decoding_options

    decoding = (callbacks or {}).get("decoding")
    if decoding is not None:
        check_decoding_options(**{key: decoding[key] for key in decoding if key != "output_dir" and not str(key).startswith("_")})


def check_humaneval_options_of(callbacks, data_source: str | None = None) -> None:
    """`callbacks.humaneval`'s settings (the callback's own rules), before the run folder exists; a synthetic task's
    symbol tokenizer cannot encode HumanEval's Python prompts."""
    from lab.callbacks.humaneval import settings_from
    from lab.data import TASKS

    humaneval = (callbacks or {}).get("humaneval")
    if humaneval is None:
        return
    settings = settings_from(**{key: humaneval[key] for key in humaneval if key != "output_dir" and not str(key).startswith("_")})
    require(settings is None or data_source not in TASKS, "callbacks.humaneval.problems",
            f"HumanEval's prompts are Python text, which data.source={data_source}'s symbol tokenizer cannot encode; allowed here: 0")


def check_decoding_callback(callbacks, refusal: str | None) -> None:
    """The end-of-run decoding evaluation on a trunk the harness cannot decode (`refusal` says why; None: it can)."""
    decoding = (callbacks or {}).get("decoding")
    require(refusal is None or decoding is None or decoding.get("prompts") == 0, "callbacks.decoding",
            f"decodes after the last step, and the harness cannot decode this trunk: {refusal}; turn it off with callbacks.decoding.prompts=0")


def check_run_config(cfg: DictConfig) -> None:
    """Run-level settings, before anything is built; each config group checks its own fields when built."""
    require(cfg.trainer.max_steps is not None and cfg.trainer.max_steps >= 1, "trainer.max_steps", "must be ≥ 1")
    check_trainer(cfg.trainer)
    check_checkpoint_cadence(cfg)
    if cfg.ckpt_path not in (None, "last"):
        require(Path(cfg.ckpt_path).exists(), "ckpt_path", f"no such checkpoint: {cfg.ckpt_path}")
        # A resume restores the checkpoint's weights over the parent's: both would be read, one silently lost.
        # (ckpt_path=last stays allowed: it resumes a run that was itself started with init_from.)
        require(not cfg.get("init_from"), "ckpt_path",
                "resumes a run from its own checkpoint, init_from starts a new run from a parent's weights: give one of them "
                "(to resume a run started with init_from, use ckpt_path=last in its run dir)")


def check_checkpoint_cadence(cfg: DictConfig) -> None:
    """Lightning refuses a step interval below 1 only when fit starts, with a multi-line error and a run folder made."""
    every = OmegaConf.select(cfg, "callbacks.checkpoint.every_n_train_steps")
    if OmegaConf.select(cfg, "callbacks.checkpoint") is not None:
        require(is_int(every) and every >= 1, "callbacks.checkpoint.every_n_train_steps",
                f"must be an integer ≥ 1 (steps between checkpoints; the final step always gets one), got {every!r}")


def check_horizons_fit(k: int, seq_len: int, offsets=None, field: str = "head.k") -> None:
    """The one check across groups: every horizon needs a target inside a row (the farthest offset, K by default).
    `field`: the setting K follows from (a self-fed DeepSeek rollout's K is head.rollout_steps + 1)."""
    if offsets is None or list(offsets) == list(range(1, k + 1)):
        if field == "head.rollout_steps":
            require(k < seq_len, field, f"must be < data.seq_len − 1 = {seq_len - 1} (step s predicts token t+s+1 of a row), got {k - 1}")
        require(k < seq_len, "head.k", f"must be < data.seq_len={seq_len}, got {k}")
    else:
        require(max(offsets) < seq_len, "head.offsets", f"every offset must be < data.seq_len={seq_len}, got {list(offsets)}")


def check_trainer(trainer: DictConfig) -> None:
    """Precision and accelerator, before the Trainer would fail with a multi-line traceback."""
    precision = str(trainer.get("precision", "32-true"))
    require(precision in PRECISIONS, "trainer.precision", f"unknown '{precision}'; allowed: {', '.join(PRECISIONS[:6])}")
    check_trainer_counts(trainer)
    check_strategy(trainer.get("strategy", "auto"))
    accelerator = str(trainer.get("accelerator", "cpu"))
    require(accelerator != "cpu" or not is_int(trainer.get("devices")) or trainer.get("devices") >= 1, "trainer.devices",
            f"must be a process count ≥ 1 on the cpu accelerator, got {trainer.get('devices')!r}")  # Lightning: a TypeError at Trainer()
    if accelerator not in ("cpu", "auto", *GPU_ACCELERATORS):
        check_other_accelerator(accelerator)
    if accelerator in GPU_ACCELERATORS:
        import torch

        require(
            torch.cuda.is_available(), "trainer.accelerator",
            f"'{accelerator}' needs a CUDA device and none is visible; allowed here: cpu, auto (e.g. trainer=default trainer.precision=bf16-mixed)",
        )


def check_trainer_counts(trainer: DictConfig) -> None:
    """Step counts Lightning would refuse (or, for log_every_n_steps, accept and misbehave on) only once fit starts."""
    interval = trainer.get("val_check_interval")
    require(
        interval is None or (is_int(interval) and interval >= 1) or (isinstance(interval, float) and 0 < interval <= 1),
        "trainer.val_check_interval", f"must be a step count ≥ 1 or a fraction of an epoch in (0, 1], got {interval!r}",
    )
    every_epochs = trainer.get("check_val_every_n_epoch")
    require_int(every_epochs, "trainer.check_val_every_n_epoch", least=1, optional=True)
    limit = trainer.get("limit_val_batches")
    require(limit is None or (is_int(limit) and limit >= 0) or (isinstance(limit, float) and 0 <= limit <= 1), "trainer.limit_val_batches",
            f"must be a batch count ≥ 0, a fraction in [0, 1] or null, got {limit!r}")
    log_every = trainer.get("log_every_n_steps", 50)
    require_int(log_every, "trainer.log_every_n_steps", least=1)
    devices = trainer.get("devices", "auto")
    require(
        not is_int(devices) or devices >= 1 or devices == -1, "trainer.devices",
        f"must be a device count ≥ 1, -1 (all), 'auto' or a list of device ids, got {devices!r}",
    )


def check_strategy(strategy) -> None:
    """A strategy name Lightning knows (a `_target_` mapping is instantiated by Hydra and checked there)."""
    if strategy == "auto" or isinstance(strategy, (dict, DictConfig)):
        return
    from pytorch_lightning.strategies import StrategyRegistry

    known = StrategyRegistry.available_strategies()
    require(isinstance(strategy, str) and strategy in known, "trainer.strategy", f"unknown '{strategy}'{did_you_mean(str(strategy), known)}; allowed: auto, {', '.join(known[:6])}, …")


def check_other_accelerator(name: str) -> None:
    """tpu, mps: known to Lightning's registry and usable on this machine (tpu needs torch_xla)."""
    from pytorch_lightning.accelerators import AcceleratorRegistry

    known = sorted(AcceleratorRegistry.available_accelerators())
    require(name in known, "trainer.accelerator", f"unknown '{name}'; allowed: auto, gpu, {', '.join(known)}")
    require(
        AcceleratorRegistry[name]["accelerator"].is_available(), "trainer.accelerator",
        f"'{name}' is not available on this machine{' (needs torch_xla)' if name == 'tpu' else ''}; allowed here: cpu, auto",
    )

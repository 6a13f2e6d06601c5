"""Start-up checks that belong to no single config group: group choices, run settings, K vs seq_len.

Every group checks its own fields once, when it is built into a typed object
(`LMDataModule`, `build_model`, `Objective.build`, `OptimConfig`).
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lab.errors import ConfigError, require
from lab.schema import did_you_mean, typed

# Lightning's precision strings (plus its short aliases); transformer-engine needs NVIDIA's package.
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true", "32", "16", "bf16", "64")
GPU_ACCELERATORS = ("gpu", "cuda")


def available_options(conf_dir: Path, group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


OPTIONAL_GROUPS = ("experiment", "hparams_search", "debug")  # default null in conf/train.yaml


def check_group_choice(key: str, choices: list[str], conf_dir: Path) -> None:
    """Each choice of group `key` names a conf/<key>/<choice>.yaml (null only for optional groups)."""
    options = available_options(conf_dir, key)
    for choice in choices:
        if choice in ("", "null"):
            if key in OPTIONAL_GROUPS:
                continue
            hint = f" (use {key}=none to turn it off)" if "none" in options else ""
            raise ConfigError(key, f"null is not an option{hint}; allowed: {', '.join(options)}")
        if choice not in options:
            raise ConfigError(key, f"unknown option '{choice}'{did_you_mean(choice, options)}; allowed: {', '.join(options)}")


def check_group_overrides(argv: list[str], conf_dir: Path) -> None:
    """`head=foo` where conf/head/foo.yaml does not exist → one line listing the options."""
    for arg in argv:
        if "=" not in arg or arg.startswith(("-", "+", "~", "hydra.")):
            continue
        key, value = arg.split("=", 1)
        # hydra/launcher, hydra/sweeper, ...: options also come from installed Hydra plugins
        if "." in key or key.startswith("hydra/") or not (conf_dir / key).is_dir():
            continue
        check_group_choice(key, [choice.strip() for choice in value.split(",")], conf_dir)


def check_config(cfg: DictConfig) -> None:
    """Every check of a run's config that needs no data and no weights, in one sequence: the run
    settings, then each group through the typed config it is built from (each field checked by its
    group's schema), then the invariants across groups. `lab-train`'s pre-flight and `build` call it."""
    from lab.data import check_data_config
    from lab.model.compile import split_compile_option
    from lab.model.heads import head_config
    from lab.model.mtp import check_head_on_trunk, head_defaults_for, model_config, trunk_layers
    from lab.objective.objective import Objective
    from lab.training.optim import OptimConfig

    def plain(group: str) -> dict:
        return OmegaConf.to_container(cfg[group], resolve=True)

    check_run_config(cfg)
    data = check_data_config(plain("data"))  # local files: exist and are not empty
    model, _ = split_compile_option(plain("model"))
    head = head_config(head_defaults_for(model, plain("head")))
    if model.get("name") != "hf":
        model["vocab_size"] = model.get("vocab_size") or 256  # the tokenizer sets it later; any size checks the rest
    check_head_on_trunk(model_config(model), head)  # compute matching, head.block, head.init, lora vs the trunk kind
    if model.get("name") == "hf":
        from lab.model.hf_trunk import preflight_hf

        hf_config = preflight_hf(model_config(model), head)  # config, tokenizer, LoRA targets: no weights loaded
        check_decoding_callback(cfg.get("callbacks"), hf_config)
    else:
        trunk_layers(model_config(model), head)  # compute matching leaves ≥ 1 trunk block
    typed(OptimConfig, plain("optim"), "optim")
    objective = OmegaConf.to_container(cfg.objective, resolve=True) if cfg.get("objective") is not None else None
    Objective.build(plain("reduction"), plain("weights"), plain("schedule"), k=head.k, objective=objective)
    require(not (objective or {}).get("teacherless") or hasattr(data, "task"), "objective.teacherless",
            f"needs a synthetic task (data=star_graph|induction), the only data with answers; got data.source={cfg.data.get('source')}")
    check_horizons_fit(head.k, data.seq_len, head.offsets)


def check_decoding_callback(callbacks, hf_config) -> None:
    """The end-of-run decoding evaluation on a trunk whose family the harness cannot decode (the MTP family table)."""
    from lab.model.mtp_families import family_path_refusal

    decoding = (callbacks or {}).get("decoding")
    refusal = family_path_refusal(hf_config, "decoding") if decoding is not None and decoding.get("prompts") != 0 else None
    require(refusal is None, "callbacks.decoding",
            f"decodes after the last step, and the harness cannot decode this trunk: {refusal}; turn it off with callbacks.decoding.prompts=0")


def check_run_config(cfg: DictConfig) -> None:
    """Run-level settings, before anything is built; each config group checks its own fields when built."""
    require(cfg.trainer.max_steps is not None and cfg.trainer.max_steps >= 1, "trainer.max_steps", "must be ≥ 1")
    check_trainer(cfg.trainer)
    if cfg.ckpt_path not in (None, "last"):
        require(Path(cfg.ckpt_path).exists(), "ckpt_path", f"no such checkpoint: {cfg.ckpt_path}")


def check_horizons_fit(k: int, seq_len: int, offsets=None) -> None:
    """The one check across groups: every horizon needs a target inside a row (the farthest offset, K by default)."""
    if offsets is None or list(offsets) == list(range(1, k + 1)):
        require(k < seq_len, "head.k", f"must be < data.seq_len={seq_len}, got {k}")
    else:
        require(max(offsets) < seq_len, "head.offsets", f"every offset must be < data.seq_len={seq_len}, got {list(offsets)}")


def check_trainer(trainer: DictConfig) -> None:
    """Precision and accelerator, before the Trainer would fail with a multi-line traceback."""
    precision = str(trainer.get("precision", "32-true"))
    require(precision in PRECISIONS, "trainer.precision", f"unknown '{precision}'; allowed: {', '.join(PRECISIONS[:6])}")
    check_trainer_counts(trainer)
    accelerator = str(trainer.get("accelerator", "cpu"))
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
    log_every = trainer.get("log_every_n_steps", 50)
    require(is_int(log_every) and log_every >= 1, "trainer.log_every_n_steps", f"must be an integer ≥ 1, got {log_every!r}")
    devices = trainer.get("devices", "auto")
    require(
        not is_int(devices) or devices >= 1 or devices == -1, "trainer.devices",
        f"must be a device count ≥ 1, -1 (all), 'auto' or a list of device ids, got {devices!r}",
    )


def check_other_accelerator(name: str) -> None:
    """tpu, mps: known to Lightning's registry and usable on this machine (tpu needs torch_xla)."""
    from pytorch_lightning.accelerators import AcceleratorRegistry

    known = sorted(AcceleratorRegistry.available_accelerators())
    require(name in known, "trainer.accelerator", f"unknown '{name}'; allowed: auto, gpu, {', '.join(known)}")
    require(
        AcceleratorRegistry[name]["accelerator"].is_available(), "trainer.accelerator",
        f"'{name}' is not available on this machine{' (needs torch_xla)' if name == 'tpu' else ''}; allowed here: cpu, auto",
    )


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

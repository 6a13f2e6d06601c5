"""Start-up checks: config-group choices and cross-field invariants, before any heavy work."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from lab.errors import ConfigError, require


def available_options(conf_dir: Path, group: str) -> list[str]:
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def check_group_overrides(argv: list[str], conf_dir: Path) -> None:
    """`head=foo` where conf/head/foo.yaml does not exist → one line listing the options."""
    for arg in argv:
        if "=" not in arg or arg.startswith(("-", "+", "~", "hydra.")):
            continue
        key, value = arg.split("=", 1)
        # hydra/launcher, hydra/sweeper, ...: options also come from installed Hydra plugins
        if "." in key or key.startswith("hydra/") or not (conf_dir / key).is_dir():
            continue
        options = available_options(conf_dir, key)
        for choice in value.split(","):
            choice = choice.strip()
            if choice in ("", "null") and key == "experiment":
                raise ConfigError("experiment", f"choose one of: {', '.join(options)}")
            if choice not in options and choice != "null":
                raise ConfigError(key, f"unknown option '{choice}'; allowed: {', '.join(options)}")


def validate_config(cfg: DictConfig) -> None:
    """Cross-field invariants (K vs seq_len, depth vs K, λ length vs K, ...)."""
    seq_len = cfg.data.seq_len
    require(isinstance(seq_len, int) and seq_len >= 2, "data.seq_len", f"must be an integer ≥ 2, got {seq_len}")
    head = cfg.head
    k = head.k if head.k is not None else (head.depth + 1 if head.depth is not None else None)
    require(k is not None and k >= 1, "head.k", f"must be ≥ 1, got {k}")
    require(k < seq_len, "head.k", f"must be < data.seq_len={seq_len}, got {k}")
    if head.name == "deepseek" and head.depth is not None:
        require(k == head.depth + 1, "head.k", f"deepseek needs head.k = head.depth + 1 = {head.depth + 1}, got {k}")
    lambdas = cfg.weights.get("lambdas")
    if lambdas is not None:
        require(len(lambdas) == k, "weights.lambdas", f"needs one λ per horizon (K={k}), got {len(lambdas)}")
    if cfg.reduction.fixed_denominator is not None:
        require(cfg.reduction.fixed_denominator > 0, "reduction.fixed_denominator", f"must be > 0, got {cfg.reduction.fixed_denominator}")
    chunk_rows = cfg.schedule.get("chunk_rows")
    if cfg.schedule.name == "chunked":
        require(isinstance(chunk_rows, int) and chunk_rows >= 1, "schedule.chunk_rows", f"must be an integer ≥ 1, got {chunk_rows}")
    require(cfg.trainer.max_steps is not None and cfg.trainer.max_steps >= 1, "trainer.max_steps", "must be ≥ 1")
    if cfg.ckpt_path not in (None, "last"):
        require(Path(cfg.ckpt_path).exists(), "ckpt_path", f"no such checkpoint: {cfg.ckpt_path}")

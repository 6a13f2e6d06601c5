"""Head registry: one file per architecture, selected by `head.name`."""

from lab.errors import ConfigError
from lab.model.heads.anticausal import AnticausalHead
from lab.model.heads.base import HeadConfig, Horizon, MTPHead, SharedParts
from lab.model.heads.causal import CausalHead
from lab.model.heads.deepseek import DeepSeekHead
from lab.model.heads.linear import LinearHead
from lab.model.heads.ntp import NextTokenHead
from lab.model.heads.parallel import ParallelHead

HEADS: dict[str, type[MTPHead]] = {
    "ntp": NextTokenHead,
    "linear": LinearHead,
    "parallel": ParallelHead,
    "causal": CausalHead,
    "anticausal": AnticausalHead,
    "deepseek": DeepSeekHead,
}


def head_class(name: str) -> type[MTPHead]:
    if name not in HEADS:
        raise ConfigError("head.name", f"unknown head '{name}'; allowed: {', '.join(HEADS)}")
    return HEADS[name]


__all__ = ["HEADS", "HeadConfig", "Horizon", "MTPHead", "SharedParts", "head_class"]

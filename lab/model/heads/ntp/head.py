"""K = 1 baseline: trunk → final norm → unembedding."""

from lab.errors import require
from lab.model.heads.base import MTPHead


class NextTokenHead(MTPHead):
    unused_options = ("n_layers", "init", "block")  # no head blocks

    @classmethod
    def check_config(cls, cfg):
        super().check_config(cfg)
        require(cfg.k == 1, "head.k", f"the ntp head predicts one horizon; got head.k={cfg.k}")

"""`head=ntp`: the K = 1 next-token baseline every variant is compared with."""

from lab.model.heads.ntp.head import NextTokenHead
from lab.model.heads.spec import HeadSpec

SPEC = HeadSpec(name="ntp", module=NextTokenHead, display_rank=0, is_baseline=True, example_k=1)

__all__ = ["SPEC", "NextTokenHead"]

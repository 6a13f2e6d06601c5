"""`head=causal`: head k's blocks read head k−1's output."""

from lab.model.heads.causal.head import CausalHead
from lab.model.heads.spec import HeadSpec

SPEC = HeadSpec(name="causal", module=CausalHead, display_rank=3)

__all__ = ["SPEC", "CausalHead"]

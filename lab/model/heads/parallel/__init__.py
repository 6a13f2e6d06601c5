"""`head=parallel`: K independent block stacks on the trunk state (Gloeckle et al.)."""

from lab.model.heads.parallel.head import ParallelHead
from lab.model.heads.spec import HeadSpec

SPEC = HeadSpec(name="parallel", module=ParallelHead, display_rank=2)

__all__ = ["SPEC", "ParallelHead"]

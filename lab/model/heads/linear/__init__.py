"""`head=linear`: horizon k is its own linear map of the trunk state (or its own V×d projection)."""

from lab.model.heads.linear.head import LinearHead
from lab.model.heads.spec import HeadSpec

SPEC = HeadSpec(name="linear", module=LinearHead, display_rank=1)

__all__ = ["SPEC", "LinearHead"]

"""`head=identity`: no parameters; every horizon projects the trunk state itself."""

from lab.model.heads.identity.head import IdentityHead
from lab.model.heads.spec import HeadSpec

SPEC = HeadSpec(name="identity", module=IdentityHead, display_rank=6)

__all__ = ["SPEC", "IdentityHead"]

"""`head=anticausal`: the chain of block stacks runs from the farthest horizon."""

from lab.model.heads.anticausal.head import AnticausalHead
from lab.model.heads.spec import HeadSpec

SPEC = HeadSpec(name="anticausal", module=AnticausalHead, display_rank=4)

__all__ = ["SPEC", "AnticausalHead"]

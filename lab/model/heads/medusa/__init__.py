"""`head=medusa`: Medusa-1 residual heads and vLLM's Medusa folder layout (release.py)."""

from lab.model.heads.medusa.head import MedusaHead, ResidualSiLU
from lab.model.heads.medusa.release import LAYOUT
from lab.model.heads.spec import HeadSpec

SPEC = HeadSpec(name="medusa", module=MedusaHead, display_rank=7, release_layouts={LAYOUT.name: LAYOUT})

__all__ = ["SPEC", "MedusaHead", "ResidualSiLU"]

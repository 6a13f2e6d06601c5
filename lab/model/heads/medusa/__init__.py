"""`head=medusa`: Medusa-1 residual heads; vLLM's Medusa folder layout is lab/release/medusa.py."""

from lab.model.heads.medusa.head import MedusaHead, ResidualSiLU
from lab.model.heads.spec import HeadSpec

SPEC = HeadSpec(name="medusa", module=MedusaHead, display_rank=7, release_layouts=("medusa",))

__all__ = ["SPEC", "MedusaHead", "ResidualSiLU"]

"""`head=deepseek`: DeepSeek-V3's chain of D depth modules, its chain drafter and its release layout.

head.py (the module and `DeepSeekConfig`), drafter.py (the carried-frontier chain), and the layout on disk:
layout.py (what config.json and the headers say), fusion_order.py, export.py, load.py, check.py, release.py.
"""

from lab.model.heads.deepseek.head import DeepSeekConfig, DeepSeekHead, DepthModule
from lab.model.heads.deepseek.release import LAYOUT
from lab.model.heads.spec import HeadSpec

SPEC = HeadSpec(
    name="deepseek",
    module=DeepSeekHead,
    display_rank=5,
    release_layouts={LAYOUT.name: LAYOUT},
    teacher_forced_metrics=True,  # depth k is fed tokens[t+1 .. t+k-1]: its accuracies are not blind guesses
    example_options=lambda k: {"depth": k - 1},  # K = D + 1
)

__all__ = ["SPEC", "DeepSeekConfig", "DeepSeekHead", "DepthModule"]

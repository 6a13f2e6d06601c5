"""`head=deepseek`: DeepSeek-V3's chain of D depth modules and its chain drafter.

head.py (the module and `DeepSeekConfig`), drafter.py (the carried-frontier chain); its layout on disk,
`lab-export --format deepseek`, is lab/release/deepseek/.
"""

from lab.model.heads.deepseek.head import DeepSeekConfig, DeepSeekHead, DepthModule
from lab.model.heads.spec import HeadSpec

SPEC = HeadSpec(
    name="deepseek",
    module=DeepSeekHead,
    display_rank=5,
    release_layouts=("deepseek",),
    teacher_forced_metrics=True,  # depth k is fed tokens[t+1 .. t+k-1]: its accuracies are not blind guesses
    example_options=lambda k: {"depth": k - 1},  # K = D + 1
)

__all__ = ["SPEC", "DeepSeekConfig", "DeepSeekHead", "DepthModule"]

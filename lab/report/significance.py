"""Is a variant's final next-token loss lower than the ntp baseline's? A one-sided Welch t-test over seeds.

Welch's test (unequal variances) of H1: mean(variant) < mean(ntp) on the per-seed final
`val/loss` values; the finding states the difference of the means and the p-value, whichever
way it goes. It needs ≥ 2 seeds on both sides (a single seed has no variance).
"""

from __future__ import annotations

import statistics

from scipy import stats

METRIC = "val/loss"


def welch_less(variant: list[float], baseline: list[float]) -> tuple[float, float]:
    """(mean(variant) − mean(baseline), one-sided p for H1: the variant's mean is lower)."""
    difference = statistics.fmean(variant) - statistics.fmean(baseline)
    if statistics.variance(variant) == 0 and statistics.variance(baseline) == 0:
        return difference, 0.0 if difference < 0 else 1.0  # no spread: the sign decides
    result = stats.ttest_ind(variant, baseline, equal_var=False, alternative="less")
    return difference, float(result.pvalue)


def significance_finding(variants, order_key) -> list[str]:
    """One line: each variant's difference to ntp in final val next-token loss, with its one-sided Welch p-value."""
    baseline = next((v for v in variants if v.is_baseline and len(v.values(METRIC)) >= 2), None)
    if baseline is None:
        return []
    parts = []
    for variant in sorted(variants, key=order_key):
        values = variant.values(METRIC)
        if variant is baseline or len(values) < 2:
            continue
        difference, p = welch_less(values, baseline.values(METRIC))
        parts.append(f"{variant.label} {difference:+.4f} (n = {len(values)} vs {len(baseline.values(METRIC))}, p = {p:.3g})")
    if not parts:
        return []
    return [f"Final validation next-token loss minus {baseline.label}'s, with the one-sided Welch t-test p-value for "
            f"\"lower than {baseline.label}\": " + "; ".join(parts) + "."]

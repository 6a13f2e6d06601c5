"""Does a variant's final next-token loss differ from the baseline's? Welch's t-test over seeds, two-sided by default.

Welch's test (unequal variances) of H0: mean(variant) = mean(baseline) on the per-seed final `val/loss` values; the
finding states the difference of the means, a 95 % bootstrap interval of it, and the p-value (two-sided unless a
direction is asked for: `alternative="less"` tests "lower than the baseline" and says so). When both sides ran the
same seeds, the seed-paired differences (same seed, same data order) are stated too, with their paired t-test. It
needs ≥ 2 seeds on both sides (a single seed has no variance).
"""

from __future__ import annotations

import random
import statistics

from scipy import stats

METRIC = "val/loss"
ALTERNATIVES = {"two-sided": "two-sided", "less": "one-sided, H1: lower than"}
BOOTSTRAP_DRAWS = 10_000


def welch(variant: list[float], baseline: list[float], alternative: str = "two-sided") -> tuple[float, float]:
    """(mean(variant) − mean(baseline), Welch p for `alternative`: "two-sided" or "less" (the variant's mean is lower))."""
    difference = statistics.fmean(variant) - statistics.fmean(baseline)
    if statistics.variance(variant) == 0 and statistics.variance(baseline) == 0:  # no spread: the sign decides
        return difference, (0.0 if difference != 0 else 1.0) if alternative == "two-sided" else (0.0 if difference < 0 else 1.0)
    return difference, float(stats.ttest_ind(variant, baseline, equal_var=False, alternative=alternative).pvalue)


def welch_less(variant: list[float], baseline: list[float]) -> tuple[float, float]:
    return welch(variant, baseline, "less")


def bootstrap_interval(variant: list[float], baseline: list[float], draws: int = BOOTSTRAP_DRAWS) -> tuple[float, float]:
    """95 % percentile interval of mean(variant) − mean(baseline), each side resampled with replacement (fixed seed)."""
    rng = random.Random(0)
    differences = sorted(statistics.fmean(rng.choices(variant, k=len(variant))) - statistics.fmean(rng.choices(baseline, k=len(baseline)))
                         for _ in range(draws))
    return differences[int(0.025 * draws)], differences[int(0.975 * draws) - 1]


def paired(variant: dict[int, float], baseline: dict[int, float]) -> tuple[float, float, float] | None:
    """(mean, sd, two-sided paired-t p) of the per-seed differences when both sides ran the same ≥ 2 seeds; else None."""
    seeds = sorted(variant)
    if seeds != sorted(baseline) or len(seeds) < 2:
        return None
    differences = [variant[s] - baseline[s] for s in seeds]
    sd = statistics.stdev(differences)
    p = float(stats.ttest_rel([variant[s] for s in seeds], [baseline[s] for s in seeds]).pvalue) if sd > 0 else (0.0 if differences[0] else 1.0)
    return statistics.fmean(differences), sd, p


def by_seed(variant) -> dict[int, float]:
    """{seed: final METRIC} of a variant's completed runs (runs without a seed are left out)."""
    return {int(r["seed"]): r["final"][METRIC] for r in variant.ok if r.get("seed") is not None and METRIC in r["final"]}


def significance_finding(variants, order_key, alternative: str = "two-sided") -> list[str]:
    """One line: each variant's difference to the baseline in final val next-token loss, its bootstrap interval, the
    Welch p-value and, with matching seeds, the seed-paired differences."""
    baseline = next((v for v in variants if v.is_baseline and len(v.values(METRIC)) >= 2), None)
    if baseline is None:
        return []
    parts = []
    for variant in sorted(variants, key=order_key):
        values = variant.values(METRIC)
        if variant is baseline or len(values) < 2:
            continue
        difference, p = welch(values, baseline.values(METRIC), alternative)
        low, high = bootstrap_interval(values, baseline.values(METRIC))
        pair = paired(by_seed(variant), by_seed(baseline))
        seeds = f"; seed-paired {pair[0]:+.4f} ± {pair[1]:.4f}, p = {pair[2]:.3g}" if pair else ""
        parts.append(f"{variant.label} {difference:+.4f} [{low:+.4f}, {high:+.4f}] (n = {len(values)} vs "
                     f"{len(baseline.values(METRIC))}, p = {p:.3g}{seeds})")
    if not parts:
        return []
    test = ("two-sided Welch t-test" if alternative == "two-sided" else f"{ALTERNATIVES[alternative]} {baseline.label}, Welch t-test")
    return [f"Final validation next-token loss minus {baseline.label}'s, with a 95 % bootstrap interval and the {test} p-value "
            f"(seed-paired: the same seeds' differences, mean ± sd, paired t-test): " + "; ".join(parts) + "."]

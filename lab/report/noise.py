"""The noise floor of the report's comparisons: how large a gap in final validation loss must be before it is read.

    ≥ 2 seeds on both sides: two variants differ when their mean losses are more than 2 standard errors apart,
        SE = s·√(1/n_a + 1/n_b), s the sample sd over seeds pooled across every variant with ≥ 2 seeds.
    otherwise: no seed spread can be measured, and the floor is ONE_SEED_SPREAD, the measured spread of one job
        of the main job's size across thread counts and CPU kernels (results/main_job_spread.json): on another
        machine the same job lands anywhere in that range, so a smaller gap is not a finding.

A gap below its floor is a tie. The report also says when the jobs of one table computed under different numerics
(CPU, kernels, libraries, threads, dtype: lab/tracking/numerics.py), where digits move by that spread or more.
"""

from __future__ import annotations

import math
import statistics

from lab.report.table import Variant
from lab.tracking.numerics import differing_fields, fingerprint_label

METRIC = "val/loss"
ONE_SEED_SPREAD = 0.0400  # nats: max − min of one job's val/loss across thread counts and CPU kernels, results/main_job_spread.json
SE_MULTIPLE = 2.0


def pooled_seed_sd(variants: list[Variant]) -> float | None:
    """The sample sd over seeds pooled across the variants with ≥ 2 seeds (None when no variant has 2)."""
    groups = [v.values(METRIC) for v in variants if len(v.values(METRIC)) >= 2]
    dof = sum(len(g) - 1 for g in groups)
    if not dof:
        return None
    return math.sqrt(sum(statistics.variance(g) * (len(g) - 1) for g in groups) / dof)


def gap_floor(a: Variant, b: Variant, sd: float | None) -> float:
    """The smallest gap between the mean losses of `a` and `b` that is read as a difference."""
    n_a, n_b = len(a.values(METRIC)), len(b.values(METRIC))
    if sd is None or n_a < 2 or n_b < 2:
        return ONE_SEED_SPREAD
    return SE_MULTIPLE * sd * math.sqrt(1 / n_a + 1 / n_b)


def verdict(gap: float, floor: float) -> str:
    return f"clears the noise floor {floor:.4f}" if abs(gap) > floor else f"inside the noise floor {floor:.4f}: a tie"


def floor_finding(variants: list[Variant]) -> list[str]:
    """One line that says how the report's floors were set for this sweep."""
    if len([v for v in variants if v.values(METRIC)]) < 2:
        return []
    sd = pooled_seed_sd(variants)
    if sd is None:
        return [f"Noise floor: one seed per variant, so no seed spread is measured; a gap in validation loss below "
                f"{ONE_SEED_SPREAD:.4f} nats (one main-job-sized job's spread across thread counts and CPU kernels) is not "
                "a finding. Run `seed=0,1` to measure this sweep's own."]
    return [f"Noise floor: the seed sd of validation loss, pooled over variants with ≥ 2 seeds, is {sd:.4f} nats; two "
            f"variants differ when their means are more than {SE_MULTIPLE:g} standard errors apart (2·sd·√(1/n_a + 1/n_b): "
            f"{SE_MULTIPLE * sd:.4f} nats at 2 seeds each)."]


def numerics_finding(records: list[dict]) -> list[str]:
    """A note when the completed jobs computed under different numerics fingerprints."""
    fingerprints = [r.get("numerics") or {} for r in records if r["status"] == "ok"]
    fields = differing_fields(fingerprints)
    if not fields:
        return []
    kinds = sorted({fingerprint_label(f) for f in fingerprints})
    return [f"The jobs of these tables computed under different numerics ({', '.join(fields)} differ): " + "; ".join(kinds) +
            f". Differences of the order of {ONE_SEED_SPREAD:.3f} nats between such jobs can come from the machine alone."]

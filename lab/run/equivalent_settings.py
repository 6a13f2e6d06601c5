"""Before a sweep trains: say when two values of a swept loss-weighting setting weigh the horizons alike.

`reduction=head_mean,sum` under uniform λ looks like a comparison of two policies, but the two
objectives differ (almost) only by a constant factor: head_mean's c_k = λ_k / N_k against sum's
c_k = λ_k, and with N_k ≈ B·(S − k) nearly equal across horizons the horizons' shares of the loss —
the effective weights c_k N_k / Σ_j c_j N_j — are 0.250 each against 0.253/0.251/0.249/0.247
(S = 128, K = 4). AdamW normalises a constant factor on the gradient away (apart from its eps and
gradient clipping), so such jobs compare little more than seeds. The grid sweeper prints one
`sweep grid:` line per such pair of values before the first job starts.

The weights are computed with the objective's own code (`Objective.build`, the reduction's
`POLICIES`, the weight schedule registry) from each job's composed config, at five points of
training (λ schedules move), with the counts of full rows without document boundaries
(N_k = batch_size · (seq_len − k)). Only settings of the `reduction` and `weights` groups are
compared: other settings change more than the weights. Jobs with one horizon are skipped (every
setting gives it weight 1).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch
from omegaconf import DictConfig, OmegaConf

from lab.objective.objective import Objective
from lab.objective.weights import Progress

WEIGHT_GROUPS = ("reduction", "weights")
SEED_KEYS = ("seed", "+seed", "++seed")
CLOSE = 0.05  # largest |w_a − w_b| / largest weight below which two settings are "alike up to a factor"
EXACT = 1e-9
TRAINING_POINTS = (0.0, 0.25, 0.5, 0.75, 1.0)


def key_of(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def value_of(override: str) -> str:
    return override.partition("=")[2]


def plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def horizon_counts(cfg) -> tuple[torch.Tensor, int]:
    """(N_k of a batch of full rows, token positions per batch)."""
    k, rows, length = int(cfg.head.k), int(cfg.data.batch_size), int(cfg.data.seq_len)
    return torch.tensor([rows * max(length - h, 0) for h in range(1, k + 1)], dtype=torch.float64), rows * length


def weight_profile(cfg) -> tuple[list[list[float]], list[float]] | None:
    """(effective weights [points][K], total loss mass Σ c_k N_k per point) of a composed job config; None for K < 2."""
    if cfg.head.get("k") is None or int(cfg.head.k) < 2:
        return None
    objective = Objective.build(plain(cfg.reduction), plain(cfg.weights), plain(cfg.schedule), k=int(cfg.head.k))
    counts, positions = horizon_counts(cfg)
    total = int(cfg.trainer.max_steps)
    weights, masses = [], []
    for step in sorted({round(f * (total - 1)) for f in TRAINING_POINTS}):
        coefficients = objective.coefficients(counts, positions, Progress(step, step * positions, total))
        weights.append([float(w) for w in coefficients.effective_weights])
        masses.append(float((coefficients.coefficients * counts).sum()))
    return weights, masses


def compare(a, b) -> tuple[float, float] | None:
    """(largest relative weight difference, loss factor b/a) when the two profiles are alike (≤ CLOSE), else None."""
    (wa, ma), (wb, mb) = a, b
    if len(wa[0]) != len(wb[0]):
        return None
    largest = max(max(max(x), max(y)) for x, y in zip(wa, wb)) or 1.0
    gap = max(abs(p - q) for x, y in zip(wa, wb) for p, q in zip(x, y)) / largest
    if gap > CLOSE:
        return None
    factors = [q / p for p, q in zip(ma, mb) if p > 0]
    return gap, (sum(factors) / len(factors) if factors else float("nan"))


def profile_text(weights: list[list[float]]) -> str:
    first, last = weights[0], weights[-1]
    text = "/".join(f"{w:.3f}" for w in first)
    return text if all(abs(p - q) <= EXACT for p, q in zip(first, last)) else f"{text} at the start, " + "/".join(f"{w:.3f}" for w in last) + " at the end"


def note(key: str, a: str, b: str, profiles, found: tuple[float, float], cfg) -> str:
    gap, factor = found
    k = len(profiles[0][0][0])
    weights = f"h1..h{k} {profile_text(profiles[0][0])} vs {profile_text(profiles[1][0])}"
    if gap <= EXACT and abs(factor - 1) <= EXACT:
        return f"sweep grid: {key}={a} and {key}={b} give the same objective here (effective weights {weights}): the jobs differ by seed alone"
    alike = f"identical effective weights {weights}" if gap <= EXACT else f"effective weights {weights}, within {gap:.1%}"
    clip = OmegaConf.select(cfg, "optim.grad_clip")
    clipping = f"; gradient clipping at {clip:g} acts on the scaled gradient" if isinstance(clip, (int, float)) and clip > 0 else ""
    return (f"sweep grid: {key}={a} and {key}={b} weigh the horizons alike up to a constant factor ({alike}; "
            f"{key}={b}'s loss ≈ {factor:.4g}× {key}={a}'s; full rows of {int(cfg.data.seq_len)} tokens, every λ step): "
            f"AdamW cancels a constant factor on the loss (up to its eps{clipping}), so these jobs will differ by "
            "little more than seed noise")


def equivalence_notes(jobs: list[list[str]], compose: Callable[[list[str]], DictConfig]) -> list[str]:
    """One `sweep grid:` line per pair of values of a swept `reduction`/`weights` setting that give alike effective
    weights in every job setting with K ≥ 2 where the two meet (jobs equal in every other override but the seed)."""
    keys: dict[str, list[str]] = {}
    for job in jobs:
        for override in job:
            values = keys.setdefault(key_of(override), [])
            if value_of(override) not in values:
                values.append(value_of(override))
    swept = [key for key, values in keys.items() if len(values) > 1 and key.split(".")[0].split("/")[0] in WEIGHT_GROUPS]
    cache: dict[tuple, object] = {}

    def profile(job: list[str]):
        identity = tuple(sorted(o for o in job if key_of(o) not in SEED_KEYS))
        if identity not in cache:
            cfg = compose(job)
            cache[identity] = (weight_profile(cfg), cfg)
        return cache[identity]

    notes = []
    for key in swept:
        contexts: dict[tuple, dict[str, list[str]]] = {}
        for job in jobs:
            rest = tuple(sorted(o for o in job if key_of(o) != key and key_of(o) not in SEED_KEYS))
            value = next((value_of(o) for o in job if key_of(o) == key), None)
            if value is not None:
                contexts.setdefault(rest, {}).setdefault(value, job)
        for a, b in itertools.combinations(keys[key], 2):
            found = []
            for by_value in contexts.values():
                if a in by_value and b in by_value:
                    (pa, cfg), (pb, _) = profile(by_value[a]), profile(by_value[b])
                    if pa is not None and pb is not None:
                        found.append(((pa, pb), compare(pa, pb), cfg))
            if found and all(result is not None for _, result, _ in found):
                profiles, result, cfg = max(found, key=lambda item: item[1][0])  # the least alike setting speaks for all
                notes.append(note(key, a, b, profiles, result, cfg))
    return notes

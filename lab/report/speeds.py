"""Speeds the report can stand behind: which were taken under contention, and which clock a ratio uses.

Each job records whether its training steps (run.json `cost.train_contended`) and its decoding
evaluation (`decode/contended`) were contended: the worker thread got less than most of the wall
time, or the machine's load exceeded its cores (the rule and its thresholds: lab/tracking/timing.py).
A contended wall time measures the machine, not the variant. So:

- every speed in the report carries the flag;
- on CPU, a contended job's speed ratios come from the worker thread's CPU time (the work done,
  whatever the wait), an uncontended one's from wall time; GPU jobs always use wall time (measured
  after a CUDA synchronisation);
- the findings name the speed columns that are unreliable, and never rank variants by a speed
  taken under contention.
"""

from __future__ import annotations

from lab.report.records import finite
from lab.report.caveats import collapsed_horizons
from lab.report.table import Variant
from lab.tracking.timing import RULE




def train_contended(variant: Variant) -> bool:
    """From the final metrics (run.json and wandb alike), else run.json's cost record."""
    return any(bool(r["final"].get("train/contended", r.get("cost", {}).get("train_contended"))) for r in variant.ok)


def decode_contended(variant: Variant) -> bool:
    return any(r["final"].get("decode/contended", 0.0) >= 0.5 for r in variant.ok)


def on_gpu(variant: Variant) -> bool:
    return any(r.get("cost", {}).get("train_device") == "cuda" for r in variant.ok)


def uses_cpu_clock(variant: Variant, contended: bool) -> bool:
    return contended and not on_gpu(variant)


def speedup_metric(variant: Variant, prefix: str = "decode") -> str:
    """The decoding speedup this variant's report uses: CPU-time ratios when its evaluation was contended on CPU."""
    return f"{prefix}/speedup_cpu" if uses_cpu_clock(variant, decode_contended(variant)) else f"{prefix}/speedup"


def speedup_cell(variant: Variant, prefix: str = "decode", digits: int = 2) -> str:
    """`median [q1–q3]` of the paired speedups (mean over seeds), marked `CPU, contended` when so measured."""
    metric = speedup_metric(variant, prefix)
    median = variant.stat(metric)[0]
    if median is None:
        return "—"
    quartiles = [variant.stat(f"{metric}_{q}")[0] for q in ("q1", "q3")]
    spread = f" [{quartiles[0]:.{digits}f}–{quartiles[1]:.{digits}f}]" if all(q is not None for q in quartiles) else ""
    mark = " (CPU, contended)" if metric.endswith("_cpu") else (" (contended)" if decode_contended(variant) else "")
    return f"{variant.cell(metric, digits)}{spread}{mark}"


SPEEDUP_HEADER = "speedup T=1 (paired median [quartiles]; wall time, worker CPU time where contended)"


def train_speed_cells(variant: Variant) -> list[str]:
    """tokens/s (wall), tokens per CPU-s (worker), worker CPU share and load (start → end), contended flag."""
    share, start, end = (variant.cost(name) for name in ("train_cpu_share", "train_load_start", "train_load_end"))
    cells = [number(variant.cost("train_tokens_per_s"), 0), number(variant.cost("train_tokens_per_cpu_s"), 0)]
    cells.append("—" if share is None else f"{share:.2f} / {start:.1f} → {end:.1f}" if finite(start) and finite(end) else f"{share:.2f}")
    cells.append(flag(train_contended(variant)) if share is not None else "—")
    return cells


TRAIN_SPEED_HEADER = ["tokens/s (train steps, wall)", "tokens per CPU-s (worker)", "CPU share / load", "contended"]


def relative_train_speed(variant: Variant, reference: Variant) -> str:
    """This variant's training speed ÷ the reference's, on CPU time when either was contended (said in the cell)."""
    cpu = uses_cpu_clock(variant, train_contended(variant)) or uses_cpu_clock(reference, train_contended(reference))
    name = "train_tokens_per_cpu_s" if cpu else "train_tokens_per_s"
    mine, theirs = variant.cost(name), reference.cost(name)
    if not mine or not theirs:
        return "—"
    return f"{mine / theirs:.2f}× ({'CPU time' if cpu else 'wall'})"


def flag(contended: bool) -> str:
    return "CONTENDED" if contended else "no"


def number(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def contention_findings(variants: list[Variant]) -> list[str]:
    """Which speed columns are unreliable and why; which clock the report's ratios use instead."""
    trained = [v for v in variants if train_contended(v)]
    decoded = [v for v in variants if decode_contended(v)]
    if not trained and not decoded:
        timed = [v for v in variants if v.stat("train/cpu_share")[0] is not None or v.stat("decode/contended")[0] is not None]
        return [f"No speed was taken under contention ({RULE}): speeds and their ratios use wall time."] if timed else []
    parts = []
    if trained:
        parts.append("training tokens/s of " + ", ".join(f"**{v.label}**{load_text(v)}" for v in trained))
    if decoded:
        parts.append("decoding speedups of " + ", ".join(f"**{v.label}** (worker CPU share {v.stat('decode/cpu_share')[0]:.2f})" for v in decoded))
    return [f"Speeds taken under contention ({RULE}): " + "; ".join(parts) + ". Their wall times measure what "
            "else the machine was doing, not what the variant costs: on CPU their ratios are shown from the worker thread's CPU "
            "time (marked), and no finding ranks variants by them."]


def load_text(variant: Variant) -> str:
    """Worker CPU share and load of the training steps, from the final metrics (what every record source has)."""
    share, start, end, cores = (variant.stat(f"train/{n}")[0] for n in ("cpu_share", "load_start", "load_end", "machine_cores"))
    if share is None:
        return ""
    load = f", load {start:.1f} → {end:.1f} on {cores:g} cores" if finite(start) and finite(end) and cores else ""
    return f" (worker CPU share {share:.2f}{load})"


def fastest_decoding_finding(variants: list[Variant]) -> list[str]:
    """The variant that decodes fastest, among those whose evaluation was not contended (the others are named, unranked)."""
    measured = [v for v in variants if v.stat("decode/speedup")[0] is not None]
    clean = [v for v in measured if not decode_contended(v)]
    skipped = [v.label for v in measured if decode_contended(v)]
    left_out = f" (not ranked, taken under contention: {', '.join(skipped)})" if skipped else ""
    if not clean:
        return [f"No variant is ranked by decoding speed: every measured speedup ({', '.join(skipped)}) was taken under contention."] if skipped else []
    best = max(clean, key=lambda v: v.stat("decode/speedup")[0])
    collapsed = collapsed_horizons(best)
    caveat = (f"; but its horizon{'s' if len(collapsed) > 1 else ''} {', '.join(f'h{k}' for k in collapsed)} predict one id in "
              "most rows (warning below): the speedup counts drafts of it" if collapsed else "")
    return [f"Fastest speculative decoding measured without contention: **{best.label}** (paired median speedup "
            f"{speedup_cell(best)}{caveat}){left_out}."]

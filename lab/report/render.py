"""report.md and a self-contained report.html (inline CSS, figures embedded as base64 PNG)."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from lab.report.answers import above_chance, clever_hans, count_runs
from lab.report.caveats import caveats, collapsed_horizons
from lab.report.gradient_conflict import gradient_conflict_findings
from lab.report.sweep_figures import ReportFigure, loss_speedup_points, order_key
from lab.report.noise import floor_finding, gap_floor, numerics_finding, pooled_seed_sd, verdict
from lab.report.records import Sweep, override_items
from lab.report.scaling import scaling_finding, scaling_points, scaling_table
from lab.report.significance import significance_finding
from lab.report.speeds import (
    SPEEDUP_HEADER,
    TRAIN_SPEED_HEADER,
    contention_findings,
    fastest_decoding_finding,
    relative_train_speed,
    speedup_cell,
    train_speed_cells,
)
from lab.report.spikes import SPIKE_MIN_NATS, SPIKE_SIGMAS, record_spikes
from lab.report.table import (
    Variant,
    baseline_of,
    drop_empty_columns,
    mean_spread,
    seed_count,
    steps_done,
    sweep_dimensions,
)

NOTES_FILE = Path(__file__).with_name("section_notes.md")  # the prose under each section, kept as prose


def read_notes(path: Path) -> dict[str, str]:
    """`## key` → the lines under that heading joined into one paragraph."""
    notes: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            notes[line[3:].strip()] = []
        elif notes and line.strip():
            notes[next(reversed(notes))].append(line.strip())
    return {key: " ".join(lines) for key, lines in notes.items()}


NOTES = read_notes(NOTES_FILE)


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def horizon_columns(variants: list[Variant]) -> int:
    return max((v.max_k for v in variants if v.ok), default=1)


def summary_lines(sweep: Sweep, variants: list[Variant]) -> list[str]:
    records = sweep.records
    times = [r["run_time_s"] for r in records if r["run_time_s"] is not None]
    dims = sweep_dimensions(records)
    lines = [
        f"- source: `{sweep.source}`",
        f"- jobs: {len(records)} ({len(sweep.completed)} ok, {len(sweep.failed)} failed)",
        f"- sweep dimensions: {', '.join(f'`{d}`' for d in dims) if dims else 'none (a single configuration)'}",
        f"- seeds per variant: {seed_count(records)} (metrics are mean ± sample sd over seeds when > 1)",
    ]
    if times:
        lines.append(f"- summed job run time: {sum(times):.1f} s")
    return lines


def shown_overrides(record: dict, dims: list[str]) -> str:
    """The overrides that tell this job apart from the others (all of them when none differ)."""
    shown = [o for o in record["overrides"] if o.partition("=")[0] in dims] or record["overrides"]
    return " ".join(shown) or record["name"]


def findings(sweep: Sweep, variants: list[Variant]) -> list[str]:
    """Plain statements computed from the numbers in the tables, each with the test it applied and its evidence."""
    out = []
    scored = sorted((v for v in variants if v.stat("val/loss")[0] is not None), key=lambda v: v.stat("val/loss")[0])
    if scored:
        best = scored[0]
        out.append(f"Lowest validation next-token loss: **{best.label}** ({best.cell('val/loss')} nats)" + runner_up(scored, variants) + ".")
        out += baseline_findings(scored, variants)
        worst = scored[-1]
        if worst is not best:
            out.append(f"Highest: **{worst.label}** ({worst.cell('val/loss')}); spread across variants "
                       f"{worst.stat('val/loss')[0] - best.stat('val/loss')[0]:.4f} nats.")
    out += horizon_trend_findings(variants)
    out += gradient_conflict_findings(variants)
    out += answer_findings(variants)
    out += scaling_finding(scaling_points(variants))
    out += cost_findings(variants)
    out += contention_findings(variants)
    out += fastest_decoding_finding(variants)
    out += spike_findings(sweep)
    out += floor_finding(variants) + numerics_finding(sweep.records)
    out += caveats(variants)
    if sweep.failed:
        dims = sweep_dimensions(sweep.records)
        out.append(f"{len(sweep.failed)} job(s) failed: " + "; ".join(f"job {r['job']} ({shown_overrides(r, dims)}): {r['error']}" for r in sweep.failed) + ".")
    return out


ANSWER_METRICS = ("val/answer_exact", "val/answer_exact_se", "val/answer_first_acc", "val/answer_exact_given_first",
                  "val/answer_token_acc", "val/answer_tf_acc")


def baseline_findings(scored: list[Variant], variants: list[Variant]) -> list[str]:
    """Differences to the sweep's baseline (report.baseline, else ntp) — or a line saying there is none to take them to."""
    baseline = baseline_of(variants)
    if baseline is None or baseline not in scored:
        return ["No single baseline variant in this sweep (no ntp job, or several): no differences to a baseline are stated; "
                "choose one with `report.baseline=LABEL` (lab-report --baseline LABEL)."] if len(scored) > 1 else []
    if len(scored) < 2:
        return []
    base, sd = baseline.stat("val/loss")[0], pooled_seed_sd(variants)
    deltas = [f"{v.label} {v.stat('val/loss')[0] - base:+.4f}{tie_mark(v.stat('val/loss')[0] - base, gap_floor(v, baseline, sd))}"
              for v in sorted(scored, key=order_key) if v is not baseline]
    return [f"Difference to the baseline {baseline.label} ({base:.4f}): " + "; ".join(deltas) + f" (negative = better than "
            f"{baseline.label}; a tie: inside the noise floor)."] + significance_finding(variants, order_key)


def tie_mark(gap: float, floor: float) -> str:
    return "" if abs(gap) > floor else " (a tie)"


def runner_up(scored: list[Variant], variants: list[Variant]) -> str:
    """`, ahead of X by G nats (clears the noise floor F)` — or says that the lead is a tie."""
    if len(scored) < 2:
        return ""
    best, second = scored[0], scored[1]
    gap = second.stat("val/loss")[0] - best.stat("val/loss")[0]
    return f", ahead of {second.label} by {gap:.4f} nats ({verdict(gap, gap_floor(best, second, pooled_seed_sd(variants)))})"


def horizon_trend_findings(variants: list[Variant]) -> list[str]:
    """Does per-horizon validation loss rise with the horizon? Two tests, each stated, with every horizon's value as evidence."""
    multi = [v for v in sorted(variants, key=order_key) if v.max_k > 1 and v.stat(f"val/loss/h{v.max_k}")[0] is not None]
    if not multi:
        return []
    series = {v.label: [v.stat(f"val/loss/h{k}")[0] for k in range(1, v.max_k + 1)] for v in multi}
    endpoints = [v for v in multi if None not in series[v.label] and series[v.label][-1] > series[v.label][0]]
    every_step = [v for v in endpoints if all(a < b for a, b in zip(series[v.label], series[v.label][1:]))]
    parts = [f"{v.label}{' (TF)' if v.teacher_forced else ''}: " + " → ".join("—" if x is None else f"{x:.3f}" for x in series[v.label])
             for v in multi]
    out = [f"Per-horizon validation loss h1 → hK. Endpoint test (hK > h1): rises in {len(endpoints)} of {len(multi)} multi-token "
           f"variants; strict test (every h(k+1) > hk): in {len(every_step)} of {len(multi)}. Evidence: " + "; ".join(parts) + "."]
    accs = [f"{v.label}: h{v.max_k} {v.stat(f'val/acc/h{v.max_k}')[0]:.3f}{forced_mark(v, v.max_k)}"
            for v in multi if v.stat(f"val/acc/h{v.max_k}")[0] is not None]
    if accs:
        out.append("Top-1 accuracy at the farthest horizon: " + "; ".join(accs) + ".")
    return out


def answer_findings(variants: list[Variant]) -> list[str]:
    """Synthetic tasks (lab/callbacks/answer_accuracy.py): the best greedy exact-match answer accuracy, and per
    variant how many seeds show the Clever-Hans signature or a decision above chance (lab/report/answers.py)."""
    scored = [v for v in sorted(variants, key=order_key) if v.stat("val/answer_exact")[0] is not None]
    if not scored:
        return []
    top = max(v.stat("val/answer_exact")[0] for v in scored)
    best = [v for v in scored if v.stat("val/answer_exact")[0] == top]
    names = " and ".join(f"**{v.label}**" for v in best) + (" (tied)" if len(best) > 1 else "")
    parts = [f"{v.label} {v.cell('val/answer_exact', 3)} (teacher-forced token acc {v.cell('val/answer_tf_acc', 3)})" for v in scored]
    out = [f"Best answer accuracy (greedy decoding, exact match): {names} ({best[0].cell('val/answer_exact', 3)}). "
           "Per variant: " + "; ".join(parts) + "."]
    return out + signature_findings(scored)


def signature_findings(scored: list[Variant]) -> list[str]:
    judged = [(v, count_runs(v.ok, clever_hans), count_runs(v.ok, above_chance)) for v in scored]
    judged = [(v, hans, above) for v, hans, above in judged if hans[1]]
    if not judged:
        return []
    chance = judged[0][0].stat("val/answer_first_chance")[0]
    parts = [f"{v.label}: decision {v.cell('val/answer_first_acc', 3)}, exact given it {v.cell('val/answer_exact_given_first', 3)}, "
             f"signature in {hans[0]}/{hans[1]} seeds, above chance in {above[0]}/{above[1]}" for v, hans, above in judged]
    shown = [v.label for v, hans, _ in judged if hans[0] == hans[1]]
    escaped = [v.label for v, _, above in judged if above[0] == above[1]]
    lead = (f"Clever-Hans signature (decision accuracy within 2 SE of chance {chance:.3f}, exact-given-decision within 2 SE of 1) "
            f"on every seed: {', '.join(f'**{name}**' for name in shown) or 'no variant'}; decision above chance by > 2 SE on every "
            f"seed: {', '.join(f'**{name}**' for name in escaped) or 'no variant'}. ")
    return [lead + "Per variant: " + "; ".join(parts) + "."]


COST_TOLERANCE = 0.05  # a finding names variants whose parameters or FLOPs differ from the reference by more


def cost_reference(variants: list[Variant], name: str) -> tuple[Variant, float] | None:
    """The ntp baseline's value when the sweep has one, else the smallest."""
    known = [(v, v.cost(name)) for v in sorted(variants, key=order_key) if v.cost(name)]
    if len(known) < 2:
        return None
    return next(((v, x) for v, x in known if v.is_baseline), min(known, key=lambda item: item[1]))


def cost_findings(variants: list[Variant]) -> list[str]:
    """Whether the variants are matched in parameters and training FLOPs per token (±5 %)."""
    out = []
    for name, what, show, differ in (
        ("params_total", "parameters", millions, "size"), ("train_flops_per_token", "training FLOPs per token", millions, "compute"),
    ):
        reference = cost_reference(variants, name)
        if reference is None:
            continue
        base, value = reference
        off = [(v, v.cost(name)) for v in sorted(variants, key=order_key) if v.cost(name) and abs(v.cost(name) / value - 1) > COST_TOLERANCE]
        if off:
            out.append(f"Variants differ by more than {COST_TOLERANCE:.0%} in {what} from {base.label} ({show(value)}): "
                       + "; ".join(f"{v.label} {show(x)} ({x / value - 1:+.1%})" for v, x in off)
                       + f" — their losses compare models of different {differ}.")
        else:
            out.append(f"All variants are within {COST_TOLERANCE:.0%} of {base.label} in {what} ({show(value)}).")
    return out


def millions(value: float | None) -> str:
    return "—" if value is None else f"{value / 1e6:.3f} M"


def cost_table(variants: list[Variant]) -> tuple[list[str], list[list[str]]]:
    """Per variant: parameters, transformer blocks, training FLOPs per token, measured throughput (wall and CPU time,
    contention) and its ratio to the reference variant, time."""
    ordered = sorted(variants, key=order_key)
    reference = next((v for v in ordered if v.is_baseline), ordered[0] if ordered else None)
    header = ["variant", "params", "blocks trunk / head / next-token path", "train FLOPs/token", *TRAIN_SPEED_HEADER,
              f"train speed ÷ {reference.label if reference else '—'} (CPU time where contended)", "train time (s)", "run time (s)"]
    rows = []
    for v in ordered:
        blocks = [v.cost(name) for name in ("blocks_trunk", "blocks_head", "blocks_next_token_path")]
        run_time = mean_spread([r["run_time_s"] for r in v.ok if r["run_time_s"] is not None])[0]
        rows.append([
            v.label, millions(v.cost("params_total")),
            " / ".join("—" if b is None else f"{b:g}" for b in blocks), millions(v.cost("train_flops_per_token")),
            *train_speed_cells(v), relative_train_speed(v, reference), fmt(v.cost("train_time_s"), 1), fmt(run_time, 1),
        ])
    return header, rows
MAX_SPIKES_NAMED = 8


def spike_findings(sweep: Sweep) -> list[str]:
    """One line naming every training-loss spike: job, variant, metric, step, value and size."""
    spikes = record_spikes(sweep.records)
    if not spikes:
        return []
    dims = sweep_dimensions(sweep.records)
    named = [f"job {r['job']} ({shown_overrides(r, dims)}) `{metric}` at step {spike.step}: {spike.value:.3f} "
             f"({spike.size:+.3f} nats over its running median {spike.baseline:.3f})" for r, metric, spike in spikes[:MAX_SPIKES_NAMED]]
    more = f"; +{len(spikes) - MAX_SPIKES_NAMED} more" if len(spikes) > MAX_SPIKES_NAMED else ""
    return [f"{len(spikes)} training-loss spike(s) (> {SPIKE_SIGMAS:g} robust sd and > {SPIKE_MIN_NATS:g} nats above the running "
            f"median): " + "; ".join(named) + more + "."]


def failed_job_lines(sweep: Sweep) -> list[str]:
    """One Markdown line per job that did not finish (failed, interrupted, running): number, directory, status, reason."""
    return [f"job {r['job']} `{r['run_dir'] or r['name']}`: **{r['status']}**: {r['error']}" for r in sweep.failed]


def run_table(sweep: Sweep, variants: list[Variant]) -> tuple[list[str], list[list[str]]]:
    max_k = horizon_columns(variants)
    dims = sweep_dimensions(sweep.records)
    pooled = sweep.n_folders > 1  # several sweep folders in one report: which one each job ran in
    header = ["job", *(["sweep folder"] if pooled else []), "overrides", "status", "val/loss", "val/bpb",
              *[f"val/loss/h{k}" for k in range(1, max_k + 1)], "steps logged", "run time (s)", "failure reason"]
    rows = []
    for r in sweep.records:
        rows.append([
            fmt(r["job"]), *([r.get("folder") or ""] if pooled else []), shown_overrides(r, dims), r["status"], fmt(r["final"].get("val/loss")), fmt(r["final"].get("val/bpb")),
            *[fmt(r["final"].get(f"val/loss/h{k}")) for k in range(1, max_k + 1)],
            fmt(steps_done(r)), fmt(r["run_time_s"], 1), r["error"] or "",
        ])
    return header, rows


def variant_table(variants: list[Variant]) -> tuple[list[str], list[list[str]]]:
    max_k = horizon_columns(variants)
    header = ["variant", "head", "K", "n ok / jobs", "val/loss", "val/bpb",
              *[f"val/loss/h{k}" for k in range(1, max_k + 1)], *[f"val/acc/h{k}" for k in range(1, max_k + 1)], "est tokens/forward (val)", "run time (s)"]
    rows = []
    for v in sorted(variants, key=order_key):
        times = mean_spread([r["run_time_s"] for r in v.ok if r["run_time_s"] is not None])[0]
        rows.append([
            v.label, fmt(v.head), fmt(v.k), f"{len(v.ok)} / {len(v.records)}", v.cell("val/loss"), v.cell("val/bpb"),
            *[v.cell(f"val/loss/h{k}") + forced_mark(v, k) + one_id_mark(v, k) for k in range(1, max_k + 1)],
            *[v.cell(f"val/acc/h{k}", 3) + forced_mark(v, k) + one_id_mark(v, k) for k in range(1, max_k + 1)],
            v.cell("val/est_tokens_per_forward", 2) + forced_mark(v, 2) + (ONE_ID if collapsed_horizons(v) else ""), fmt(times, 1),
        ])
    return header, rows



ONE_ID = " 1-id"  # after a number of (or drawn from) a horizon that predicts one id in most of its rows (section_notes one_id)


def one_id_mark(variant: Variant, k: int) -> str:
    """' 1-id' after a horizon-k number when that horizon predicts one id in most validation rows (lab/report/caveats.py)."""
    return ONE_ID if k in collapsed_horizons(variant) else ""


def forced_mark(variant: Variant, k: int) -> str:
    """' TF' after a teacher-forced horizon-k number (a DeepSeek depth, k ≥ 2), else nothing."""
    return " TF" if variant.teacher_forced and k >= 2 and variant.max_k >= k else ""


def variants_having(variants: list[Variant], *metrics: str) -> list[Variant]:
    """The variants, in report order, with a value for at least one of `metrics` (a table's rows; none: no table)."""
    return [v for v in sorted(variants, key=order_key) if any(v.stat(name)[0] is not None for name in metrics)]


def decoding_table(variants: list[Variant]) -> tuple[list[str], list[list[str]]] | None:
    """Live decoding (DecodingEval): the T=1 headline, both acceptance conventions, degeneracy, greedy; None when no run decoded."""
    rows_with = variants_having(variants, "decode/distinct4", "decode/tokens_per_forward")
    if not rows_with:
        return None
    positions = max(v.max_k for v in rows_with) - 1
    header = ["variant", "head", "K", "tokens/forward T=1", "mean accept len (with bonus, τ)", "mean accepted (no bonus)",
              *[f"P(prefix≥{j}) T=1" for j in range(1, positions + 1)], *[f"P({j} | 1..{j - 1}) T=1" for j in range(1, positions + 1)],
              SPEEDUP_HEADER, "path accept T=1", "top-1 all in [Fréchet] T=1", "distinct-4 T=1", "degenerate T=1", "tokens/forward greedy", "distinct-4 greedy", "degenerate greedy",
              "greedy match", "est tokens/forward (val)"]
    rows = [[v.label, fmt(v.head), fmt(v.k), headline_cell(v, "decode/tokens_per_forward"), headline_cell(v, "decode/mean_accept_len"),
             headline_cell(v, "decode/mean_accepted"), *[v.cell(f"decode/accept/p{j}", 2) for j in range(1, positions + 1)],
             *[v.cell(f"decode/accept_cond/p{j}", 2) for j in range(1, positions + 1)], speedup_cell(v),
             v.cell("decode/path_accept", 2), frechet_cell(v), v.cell("decode/distinct4", 2), degenerate_cell(v, "decode"), headline_cell(v, "decode/greedy/tokens_per_forward", "decode/greedy"),
             v.cell("decode/greedy/distinct4", 2), degenerate_cell(v, "decode/greedy"), v.cell("decode/greedy/greedy_match", 2),
             v.cell("val/est_tokens_per_forward", 2)]
            for v in rows_with]
    return header, rows


def frechet_cell(variant: Variant) -> str:
    """`top1_all in [lower, upper]`: the measured all-drafts-right rate inside its Fréchet bounds; — when not logged."""
    values = [variant.stat(f"decode/{name}")[0] for name in ("top1_all", "frechet_lower", "frechet_upper")]
    if any(value is None for value in values):
        return "—"
    return "{:.2f} in [{:.2f}, {:.2f}]".format(*values)


def headline_cell(variant: Variant, metric: str, prefix: str = "decode") -> str:
    """A headline number, or why there is none: every prompt's continuation was degenerate."""
    if variant.stat(metric)[0] is None and variant.stat(f"{prefix}/degenerate")[0] == 1.0:
        return "— (all degenerate)"
    return variant.cell(metric, 2)


def degenerate_cell(variant: Variant, prefix: str) -> str:
    """The share of prompts whose continuation has < 20 % distinct 4-grams, flagged when any."""
    share = variant.stat(f"{prefix}/degenerate")[0]
    if share is None:
        return "—"
    return f"{share:.2f} DEGENERATE" if share > 0 else "0.00"


def loss_speedup_table(variants: list[Variant]) -> tuple[list[str], list[list[str]]] | None:
    """One row per variant of `loss_speedup_points`; None when no run measured a speedup."""
    points = loss_speedup_points(variants)
    if not any(p.measured for p in points):
        return None
    header = ["variant", "head", "K", "val/loss (next token)", "measured " + SPEEDUP_HEADER, "tokens/forward T=1", "mean accept len (τ)"]
    rows = [[p.variant.label, fmt(p.variant.head), fmt(p.variant.k), p.variant.cell("val/loss"),
             speedup_cell(p.variant, digits=3) if p.measured else "1 (plain decoding)",
             p.variant.cell("decode/tokens_per_forward", 2), p.variant.cell("decode/mean_accept_len", 2)] for p in points]
    return header, rows



def acceptance_table(variants: list[Variant]) -> tuple[list[str], list[list[str]]] | None:
    """Training-time acceptance (lab/callbacks/acceptance.py) next to the decoding's tokens/forward; None when no run has it."""
    rows_with = variants_having(variants, "val/tau", "val/accept/h2")
    if not rows_with:
        return None
    horizons = range(2, max(v.max_k for v in rows_with) + 1)
    kept = [k for k in horizons if any(v.stat(f"train/kept/h{k}")[0] is not None for v in rows_with)]
    header = ["variant", "head", "K", *[f"ᾱ h{k} (val)" for k in horizons], "τ (val)", "τ (train)", "tokens/forward T=1 (decoded)",
              "τ (val) ÷ decoded", *[f"kept h{k} (train)" for k in kept]]
    return header, [[v.label, fmt(v.head), fmt(v.k), *[v.cell(f"val/accept/h{k}", 3) + forced_mark(v, k) for k in horizons],
                     v.cell("val/tau", 2), v.cell("train/tau", 2), v.cell("decode/tokens_per_forward", 2), tau_ratio_cell(v),
                     *[v.cell(f"train/kept/h{k}", 2) for k in kept]] for v in rows_with]


def tau_ratio_cell(variant: Variant) -> str:
    """Validation τ over the decoded tokens per forward at T=1: how far the training-time estimate is from decoding."""
    tau, decoded = variant.stat("val/tau")[0], variant.stat("decode/tokens_per_forward")[0]
    return "—" if tau is None or not decoded else f"{tau / decoded:.2f}"



def objectives_table(variants: list[Variant]) -> tuple[list[str], list[list[str]]] | None:
    """Drafter objectives side by side (target × truncation × rollout) with what decoding measured; None when the
    sweep has one objective or nothing decoded."""
    rows_with = variants_having(variants, "decode/tokens_per_forward")
    if len({v.first.get("drafter_objective") for v in rows_with}) < 2:
        return None
    positions = max(v.max_k for v in rows_with) - 1
    header = ["variant", "head", "K", "objective (target, truncation, rollout)", *[f"P(prefix≥{j}) T=1" for j in range(1, positions + 1)],
              *[f"P({j} | 1..{j - 1}) T=1" for j in range(1, positions + 1)], "tokens/forward T=1", SPEEDUP_HEADER, "τ (val)",
              "training CPU s"]
    return header, [[v.label, fmt(v.head), fmt(v.k), fmt(v.first.get("drafter_objective")),
                     *[v.cell(f"decode/accept/p{j}", 2) for j in range(1, positions + 1)],
                     *[v.cell(f"decode/accept_cond/p{j}", 2) for j in range(1, positions + 1)],
                     headline_cell(v, "decode/tokens_per_forward"), speedup_cell(v), v.cell("val/tau", 2), fmt(training_cpu_s(v), 0)]
                    for v in rows_with]


def training_cpu_s(variant: Variant) -> float | None:
    """The training's CPU seconds (the process's: every torch thread; else the worker thread's), mean over the variant's jobs."""
    return variant.cost("train_process_cpu_s") or variant.cost("train_thread_cpu_s")



def humaneval_table(variants: list[Variant]) -> tuple[list[str], list[list[str]]] | None:
    """HumanEval (lab-eval or the end-of-run callback): pass@k and the decoding speed on its prompts; None when no run has it."""
    rows_with = variants_having(variants, "eval/humaneval/pass@1")
    if not rows_with:
        return None
    ks = sorted({int(name.rsplit("@", 1)[1]) for v in rows_with for r in v.ok for name in r["final"]
                 if name.startswith("eval/humaneval/pass@")})
    header = ["variant", "head", "K", "problems", *[f"pass@{k}" for k in ks], "plain pass@1", "differing completions",
              "tokens/forward", "tokens/s", "speedup (median)"]
    return header, [[v.label, fmt(v.head), fmt(v.k), v.cell("eval/humaneval/problems", 0), *[v.cell(f"eval/humaneval/pass@{k}", 3) for k in ks],
                     v.cell("eval/humaneval/plain_pass@1", 3), v.cell("eval/humaneval/differing_completions", 0),
                     v.cell("eval/humaneval/tokens_per_forward", 2), v.cell("eval/humaneval/decode_tokens_per_s", 1),
                     v.cell("eval/humaneval/speedup_median", 2)] for v in rows_with]



def answer_table(variants: list[Variant]) -> tuple[list[str], list[list[str]]] | None:
    """Answer accuracy of a synthetic task, greedy next to teacher-forced; None when no run has it."""
    rows_with = variants_having(variants, "val/answer_exact")
    if not rows_with:
        return None
    header = ["variant", "head", "K", *[name.removeprefix("val/") for name in ANSWER_METRICS], "answers scored"]
    scored = lambda v: fmt(None if v.stat("val/answer_examples")[0] is None else int(v.stat("val/answer_examples")[0]))  # noqa: E731
    return header, [[v.label, fmt(v.head), fmt(v.k), *[v.cell(name, 3) for name in ANSWER_METRICS], scored(v)] for v in rows_with]



def optional_sections(variants: list[Variant]) -> list[tuple[str, str, tuple[list[str], list[list[str]]]]]:
    """(title, note, table) of the sections only some sweeps have."""
    points = scaling_points(variants)
    candidates = [("Scaling (loss difference to ntp by model size)", NOTES["scaling"], scaling_table(points) if points else None),
                  ("Answer accuracy (synthetic tasks)", NOTES["answers"], answer_table(variants)),
                  ("HumanEval", NOTES["humaneval"], humaneval_table(variants)),
                  ("Training-time acceptance", NOTES["acceptance"], acceptance_table(variants)),
                  ("Drafter objectives", NOTES["objectives"], objectives_table(variants)),
                  ("Decoding (live, end of training)", NOTES["decoding"], decoding_table(variants)),
                  ("Next-token loss vs decoding speedup", NOTES["loss_speedup"], loss_speedup_table(variants))]
    return [(title, note, table) for title, note, table in candidates if table is not None]



def md_escape(cell: str) -> str:
    return str(cell).replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    header, rows, _ = drop_empty_columns(header, rows)
    lines = ["| " + " | ".join(md_escape(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
    return lines


def default_title(sweep: Sweep) -> str:
    """What the sweep varied and how many jobs it ran, e.g. 'head × head.k × seed, 10 jobs' (a dimension that follows
    from the others, like DeepSeek's head.depth from head.k, is left out); one configuration: its name."""
    dims = independent_dimensions(sweep.records)
    jobs = f"{len(sweep.records)} job{'s' if len(sweep.records) != 1 else ''}"
    pooled = f" from {sweep.n_folders} sweeps" if sweep.n_folders > 1 else ""
    return f"{' × '.join(dims)}, {jobs}{pooled}" if dims else f"{sweep.name}: one configuration, {jobs}{pooled}"


def independent_dimensions(records: list[dict]) -> list[str]:
    """The sweep dimensions, less those whose value the remaining ones decide (checked from the last one back)."""
    dims = sweep_dimensions(records)
    values = [dict(override_items(r["overrides"])) for r in records]
    for dim in reversed(list(dims)):
        others = [d for d in dims if d != dim]
        seen: dict[tuple, set] = {}
        for items in values:
            seen.setdefault(tuple(items.get(d) for d in others), set()).add(items.get(dim))
        if others and all(len(found) == 1 for found in seen.values()):
            dims = others
    order = next((list(items) for items in values if set(dims) <= set(items)), dims)  # as a job that sets them all lists them
    return sorted(dims, key=order.index)


def report_title(sweep: Sweep, title: str | None) -> str:
    return title or default_title(sweep)


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def page_sections(sweep: Sweep, variants: list[Variant]) -> list[tuple[str, str]]:
    """(id, heading) of every section, in page order: what was found and shown first, the per-job detail last."""
    out = [("findings", "Findings"), ("variants", "Variants (mean ± sd over seeds)"), ("figures", "Figures"),
           ("cost", "Cost per variant (mean over seeds)")]
    out += [(slug(title), title) for title, _, _ in optional_sections(variants)]
    out.append(("jobs", "Jobs"))
    if sweep.failed:
        out.append(("failed-jobs", "Failed jobs"))
    return out


NAV_NAMES = {"Variants (mean ± sd over seeds)": "Variants", "Cost per variant (mean over seeds)": "Cost"}


def nav_name(heading: str) -> str:
    return NAV_NAMES.get(heading, heading.split(" (")[0])


def markdown(sweep: Sweep, variants: list[Variant], figures: list[ReportFigure], figures_rel: str, title: str | None = None) -> str:
    sections = dict(page_sections(sweep, variants))
    ids = {heading: key for key, heading in sections.items()}
    contents = " · ".join(f"[{nav_name(heading)}](#{key})" for key, heading in sections.items())

    def heading(text: str) -> list[str]:
        return ["", f'<a id="{ids[text]}"></a>', "", f"## {text}", ""]

    lines = [f"# {report_title(sweep, title)}", "", *summary_lines(sweep, variants), "", f"Contents: {contents}", *heading("Findings")]
    lines += [f"- {line}" for line in findings(sweep, variants)] or ["- no completed runs"]
    lines += [*heading("Variants (mean ± sd over seeds)"), *md_table(*variant_table(variants))]
    if any(v.teacher_forced for v in variants):
        lines += ["", NOTES["teacher_forced"]]
    if any(collapsed_horizons(v) for v in variants):
        lines += ["", NOTES["one_id"]]
    lines += heading("Figures")
    for fig in figures:
        if fig.path is None:
            lines += [f"- {fig.caption}: not drawn ({fig.reason})", ""]
        else:
            lines += [f"### {fig.caption}", "", f"![{fig.caption}]({figures_rel}/{fig.name})", ""]
    lines += [*heading("Cost per variant (mean over seeds)"), *md_table(*cost_table(variants))]
    for title_, note, table in optional_sections(variants):
        lines += [*heading(title_), note, "", *md_table(*table)]
    lines += [*heading("Jobs"), *md_table(*run_table(sweep, variants))]
    if sweep.failed:
        lines += heading("Failed jobs")
        lines += [f"- {line}" for line in failed_job_lines(sweep)]
    lines += ["", "All numbers come from `runs.csv` (final metrics of each job); rebuild with `lab-report <sweep dir>`.", ""]
    return "\n".join(lines)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3;overflow-wrap:anywhere}td{white-space:nowrap}td:first-child{white-space:normal;overflow-wrap:anywhere;min-width:8em}
td:first-child,td:nth-child(2){text-align:left}tr.failed td{background:#fde8e8}td.wrap{white-space:normal;overflow-wrap:anywhere;text-align:left;min-width:12em}
li,p,h1,h2,h3{overflow-wrap:anywhere}.fit{max-width:100%;overflow-x:auto}.fit table{margin:0.5em 0}
img{max-width:100%;border:1px solid #eee}code{background:#f5f5f5;padding:0 3px}.reason{text-align:left;color:#a00}
.part{color:#666;font-size:12px;margin:0.8em 0 -0.6em}
nav.toc{position:sticky;top:0;z-index:1;background:#fff;border-bottom:1px solid #ddd;padding:0.45em 0;font-size:14px;line-height:1.7}
nav.toc a{margin-right:1.1em;color:#1a5fb4;text-decoration:none;white-space:nowrap}nav.toc a:hover{text-decoration:underline}
.anchor{display:block;position:relative;top:-3.2em;visibility:hidden}.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:0.6em 1.2em}
.figs figure{margin:0}.figs figure.wide{grid-column:1/-1}.figs figcaption{font-weight:600;font-size:14px;margin:0.6em 0 0.3em}.figs p{grid-column:1/-1;margin:0.2em 0}
"""
# The page is 1200 px wide; a table wider than this is split into column groups, each repeating the first
# column, so on a page of that width no column is hidden behind a scroll bar (on a narrower window a table
# scrolls inside its box). Widths are estimated from the text (13 px type).
TABLE_BUDGET_PX = 1100
CHAR_PX = 7.6
CELL_PAD_PX = 16
FIRST_COLUMN_CHARS = 30  # the label column wraps at this many characters
WRAPPED_CELL_CHARS = 40  # free-text columns (overrides, failure reasons) wrap too


def column_px(header: str, cells: list[str], index: int, wrapped: bool) -> float:
    longest_word = max((len(word) for word in header.split()), default=0)
    text = max((len(str(c)) for c in cells), default=0)
    if index == 0:
        text = min(text, FIRST_COLUMN_CHARS)
    elif wrapped:
        text = min(text, WRAPPED_CELL_CHARS)
    return max(longest_word, text) * CHAR_PX + CELL_PAD_PX


def column_groups(header: list[str], rows: list[list[str]], wrapped: set[int]) -> list[list[int]]:
    """Column indexes per printed table: the first column, then as many others as fit TABLE_BUDGET_PX."""
    widths = [column_px(h, [row[i] for row in rows], i, i in wrapped) for i, h in enumerate(header)]
    groups, current, used = [], [0], widths[0]
    for i in range(1, len(header)):
        if used + widths[i] > TABLE_BUDGET_PX and len(current) > 1:
            groups.append(current)
            current, used = [0], widths[0]
        current.append(i)
        used += widths[i]
    return groups + [current]


WRAP_TD = '<td class="wrap">'


def html_table(header: list[str], rows: list[list[str]], failed_rows: set[int] | None = None, wrapped: set[int] = frozenset()) -> str:
    """One table, or several column groups when it would be wider than the page (`wrapped`: free-text columns)."""
    header, rows, kept = drop_empty_columns(header, rows)
    wrapped = {kept.index(i) for i in wrapped if i in kept}
    groups = column_groups(header, rows, set(wrapped))
    out = []
    for number, columns in enumerate(groups, 1):
        if len(groups) > 1:
            out.append(f'<p class="part">columns {number} of {len(groups)}</p>')
        out.append('<div class="fit"><table>')
        out.append("<tr>" + "".join(f"<th>{html.escape(header[i])}</th>" for i in columns) + "</tr>")
        for index, row in enumerate(rows):
            css = ' class="failed"' if failed_rows and index in failed_rows else ""
            cells = "".join((WRAP_TD if i in wrapped else "<td>") + f"{html.escape(str(row[i]))}</td>" for i in columns)
            out.append(f"<tr{css}>{cells}</tr>")
        out.append("</table></div>")
    return "\n".join(out)


def inline_md(text: str) -> str:
    """The tiny subset of markdown the findings use: **bold** and `code`."""
    escaped = html.escape(text)
    escaped = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", escaped)


WIDE_FIGURE = 3.3  # width / height above which a figure takes both columns of the figure grid


def png_aspect(png: bytes) -> float:
    """Width / height from a PNG's IHDR chunk (0 when the bytes are no PNG)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n" or len(png) < 24:
        return 0.0
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    return width / height if height else 0.0


def html_page(sweep: Sweep, variants: list[Variant], figures: list[ReportFigure], title: str | None = None) -> str:
    """The page: title, a navigation bar (a link to every section, kept at the top while scrolling), the summary,
    findings and variants, the figures two abreast, then the tables of cost and per-job detail."""
    sections = page_sections(sweep, variants)
    ids = {heading: key for key, heading in sections}
    name = html.escape(report_title(sweep, title))

    def h2(text: str) -> str:
        return f'<a class="anchor" id="{ids[text]}"></a><h2>{html.escape(text)}</h2>'  # the id before the heading: splits on <h2> hold

    parts = [
        "<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">", "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>{name}</title>", f"<style>{CSS}</style>", "</head><body>", f"<h1>{name}</h1>",
        '<nav class="toc">' + "".join(f'<a href="#{key}">{html.escape(nav_name(heading))}</a>' for key, heading in sections) + "</nav>",
        "<ul>",
    ]
    parts += [f"<li>{inline_md(line[2:])}</li>" for line in summary_lines(sweep, variants)]
    parts += ["</ul>", h2("Findings"), "<ul>"]
    parts += [f"<li>{inline_md(line)}</li>" for line in findings(sweep, variants)] or ["<li>no completed runs</li>"]
    parts += ["</ul>", h2("Variants (mean ± sd over seeds)"), html_table(*variant_table(variants))]
    if any(v.teacher_forced for v in variants):
        parts.append(f"<p>{inline_md(NOTES['teacher_forced'])}</p>")
    if any(collapsed_horizons(v) for v in variants):
        parts.append(f"<p>{inline_md(NOTES['one_id'])}</p>")
    parts += [h2("Figures"), '<div class="figs">']
    for fig in figures:
        if fig.path is None:
            parts.append(f"<p><em>{html.escape(fig.caption)}: not drawn ({html.escape(fig.reason or '')})</em></p>")
            continue
        png = Path(fig.path).read_bytes()
        data = base64.b64encode(png).decode("ascii")
        wide = ' class="wide"' if png_aspect(png) > WIDE_FIGURE else ""  # several panels side by side: the full width
        parts.append(f"<figure{wide}><figcaption>{html.escape(fig.caption)}</figcaption>"
                     f'<img alt="{html.escape(fig.caption)}" src="data:image/png;base64,{data}"></figure>')
    parts += ["</div>", h2("Cost per variant (mean over seeds)"), html_table(*cost_table(variants))]
    for title_, note, table in optional_sections(variants):
        parts += [h2(title_), f"<p>{inline_md(note)}</p>", html_table(*table)]
    header, rows = run_table(sweep, variants)
    failed = {i for i, r in enumerate(sweep.records) if r["status"] != "ok"}
    overrides_column = header.index("overrides")
    parts += [h2("Jobs"), html_table(header, rows, failed, wrapped={overrides_column, len(header) - 1})]  # overrides, failure reason
    if sweep.failed:
        parts += [h2("Failed jobs"), "<ul>", *[f"<li>{inline_md(line)}</li>" for line in failed_job_lines(sweep)], "</ul>"]
    parts += ["<p>Rebuild with <code>lab-report &lt;sweep dir&gt;</code>; the numbers are those of <code>runs.csv</code>.</p>", "</body></html>", ""]
    return "\n".join(parts)

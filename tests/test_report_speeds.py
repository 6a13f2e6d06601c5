"""The report's speeds (lab/report/speeds.py) from hand-built run records: the contention flag beside every speed,
CPU-time ratios for contended CPU jobs, a finding naming the unreliable columns, no ranking by a contended speed."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lab.report.records import Sweep, empty_record
from lab.report.render import cost_table, decoding_table, findings, loss_speedup_table
from lab.report.table import variants

# head -> (train tokens/s wall, per CPU-s, CPU share, contended; decode speedup wall, CPU, contended)
JOBS = {
    "ntp": (1000.0, 1050.0, 0.95, False, None, None, False),
    "parallel": (250.0, 1000.0, 0.25, True, 0.40, 1.90, True),  # the busy machine's numbers: a "slow" variant
    "deepseek": (900.0, 950.0, 0.95, False, 1.50, 1.55, False),
    "linear": (950.0, 990.0, 0.96, False, 1.20, 1.25, False),
}


def record(job: int, head: str) -> dict:
    wall, per_cpu, share, contended, speedup, speedup_cpu, decode_contended = JOBS[head]
    final = {"val/loss": 3.0 + job / 10, "train/contended": float(contended), "train/cpu_share": share, "train/machine_cores": 2.0,
             "train/load_start": 6.0 if contended else 0.5, "train/load_end": 7.0 if contended else 0.6}
    if speedup is not None:
        final.update({"decode/speedup": speedup, "decode/speedup_q1": speedup - 0.1, "decode/speedup_q3": speedup + 0.1,
                      "decode/speedup_cpu": speedup_cpu, "decode/speedup_cpu_q1": speedup_cpu - 0.2,
                      "decode/speedup_cpu_q3": speedup_cpu + 0.2, "decode/contended": float(decode_contended),
                      "decode/cpu_share": 0.3 if decode_contended else 0.97, "decode/tokens_per_forward": 2.0,
                      "decode/distinct4": 0.8, "decode/degenerate": 0.0})
    cost = {"train_tokens_per_s": wall, "train_tokens_per_cpu_s": per_cpu, "train_cpu_share": share, "train_contended": contended,
            "train_load_start": 6.0 if contended else 0.5, "train_load_end": 7.0 if contended else 0.6, "train_machine_cores": 2,
            "train_device": "cpu"}
    return {**empty_record(), "job": job, "name": f"{job}-{head}", "overrides": [f"head={head}"], "status": "ok", "head": head,
            "k": 1 if head == "ntp" else 4, "final": final, "cost": cost}


def sweep() -> Sweep:
    return Sweep("speeds", "hand-built", [record(job, head) for job, head in enumerate(JOBS)])


def by_label(table) -> dict[str, dict[str, str]]:
    header, rows = table
    return {row[0]: dict(zip(header, row)) for row in rows}


def test_contended_speeds_carry_the_flag_and_use_cpu_time():
    groups = variants(sweep().records)
    cost = by_label(cost_table(groups))
    assert cost["head=parallel"]["contended"] == "CONTENDED" and cost["head=deepseek"]["contended"] == "no"
    assert cost["head=parallel"]["CPU share / load"] == "0.25 / 6.0 → 7.0"
    ratio = "train speed ÷ head=ntp (CPU time where contended)"
    assert cost["head=parallel"][ratio] == f"{1000.0 / 1050.0:.2f}× (CPU time)"  # not 250/1000 = 0.25× on wall time
    assert cost["head=deepseek"][ratio] == f"{900.0 / 1000.0:.2f}× (wall)"
    decoding = by_label(decoding_table(groups))
    column = next(name for name in decoding["head=parallel"] if name.startswith("speedup T=1"))
    assert "CPU time where contended" in column
    assert decoding["head=parallel"][column] == "1.90 [1.70–2.10] (CPU, contended)"
    assert decoding["head=deepseek"][column] == "1.50 [1.40–1.60]"
    loss_speed = by_label(loss_speedup_table(groups))
    assert next(v for k, v in loss_speed["head=parallel"].items() if k.startswith("measured speedup")).startswith("1.900 [")


def test_findings_name_contended_columns_and_never_rank_by_them():
    lines = findings(sweep(), variants(sweep().records))
    contention = [line for line in lines if line.startswith("Speeds taken under contention")]
    assert len(contention) == 1
    assert "training tokens/s of **head=parallel** (worker CPU share 0.25, load 6.0 → 7.0 on 2 cores)" in contention[0]
    assert "decoding speedups of **head=parallel**" in contention[0] and "head=deepseek" not in contention[0]
    fastest = [line for line in lines if line.startswith("Fastest speculative decoding")]
    # parallel's CPU-time ratio (1.90) would win: it is named as not ranked, and deepseek (1.50) is the fastest measured cleanly
    assert fastest == ["Fastest speculative decoding measured without contention: **head=deepseek** (paired median speedup "
                       "1.50 [1.40–1.60]) (not ranked, taken under contention: head=parallel)."]


def test_no_contention_is_said_and_ratios_stay_on_wall_time():
    records = [record(job, head) for job, head in enumerate(("ntp", "deepseek", "linear"))]
    lines = findings(Sweep("idle", "hand-built", records), variants(records))
    assert any(line.startswith("No speed was taken under contention") for line in lines)
    assert not any("CONTENDED" in cell for row in cost_table(variants(records))[1] for cell in row)


def test_the_report_cites_no_outside_document():
    report = Path(__file__).resolve().parents[1] / "lab" / "report"
    found = subprocess.run(["grep", "-rnE", "DESIGN|§", str(report)], capture_output=True, text=True).stdout
    assert found == "", found

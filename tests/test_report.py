"""Sweep report on stored run data (synthetic job directories and fake wandb runs; no training)."""

import csv
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from lab.report.build import build_report, build_sweep_report
from lab.report.records import (
    ReportError,
    collect_sweep,
    record_from_wandb,
    sweep_from_wandb_runs,
)
from lab.report.table import sweep_dimensions, variants
from tests.cli import SUBPROCESS_TIMEOUT, command_in_process, lab_report, one_error_line

HEADS = {"ntp": 1, "parallel": 4, "deepseek": 4}
# parallel: +2 % parameters, +4 % FLOPs (within 5 %); deepseek: +20 % parameters, +10 % FLOPs.
COSTS = {
    head: {"params_total": params, "blocks_trunk": trunk, "blocks_head": 6 - trunk, "blocks_next_token_path": path,
           "train_flops_per_token": flops, "train_tokens_per_s": 1000.0, "train_time_s": 8.0}
    for head, params, trunk, path, flops in (
        ("ntp", 1_000_000, 6, 6, 10_000_000), ("parallel", 1_020_000, 2, 3, 10_400_000), ("deepseek", 1_200_000, 3, 3, 11_000_000),
    )
}


SIZE_PARAMS = {(size, head): {"params_total": params} for size, head, params in (
    ("a", "ntp", 200_000), ("a", "parallel", 210_000), ("b", "ntp", 2_000_000), ("b", "parallel", 2_100_000))}


def fake_job(sweep: Path, job: int, head: str, seed: int, status: str = "ok", error: str | None = None, shift: float = 0.0,
             size: str | None = None) -> Path:
    """A job directory as `lab-train -m` leaves it: .hydra/, metrics.csv, run.json (`size`: an extra override)."""
    k = HEADS[head]
    run_dir = sweep / f"{job}-{head}-k{k}"
    (run_dir / ".hydra").mkdir(parents=True)
    overrides = [f"head={head}", f"seed={seed}", "trainer.max_steps=20"] + ([f"size={size}"] if size else [])
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run_dir / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  job:\n    num: {job}\n")
    base = 3.0 + 0.1 * list(HEADS).index(head) + shift + 0.01 * seed
    names = [f"train/loss/h{h}" for h in range(1, k + 1)] + [f"train/weight_eff/h{h}" for h in range(1, k + 1)]
    names += ["mem/logits_live_bytes", "mem/saved_peak_bytes", "train/tokens_per_s", "train/lambda/h2" if k > 1 else "train/loss"]
    names += [f"grad/cos/leaf/h{i}_h{j}" for i in range(1, k + 1) for j in range(i + 1, k + 1)]
    val_names = ["val/loss", "val/bpb"] + [f"val/{m}/h{h}" for m in ("loss", "acc", "chain_acc") for h in range(1, k + 1)]
    val_names += [f"val/{m}/h{h}" for m in ("agree", "agree_chain") for h in range(2, k + 1)] + (["val/est_tokens_per_forward"] if k > 1 else [])
    if k > 1:  # the end-of-training decoding evaluation
        val_names += ["decode/tokens_per_forward", "decode/speedup", *[f"decode/accept/p{j}" for j in range(1, k)]]
    last_step = 19 if status == "ok" else 7
    with (run_dir / "metrics.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["epoch", "step", *names, *val_names])
        writer.writeheader()
        for step in range(last_step + 1):
            row = {"epoch": 0, "step": step}
            for name in names:
                h = int(name.rsplit("h", 1)[-1].split("_")[0]) if "/h" in name else 1
                row[name] = {"mem": 1000.0 * k, "trai": base + h * 0.3 + 1.0 / (step + 1), "grad": 0.1 * h}.get(name[:4], base + 1.0 / (step + 1))
            writer.writerow(row)
            if step in (9, 19) and status == "ok":
                writer.writerow({"epoch": 0, "step": step, **{n: final_value(n, base) for n in val_names}})
    final = {n: final_value(n, base) for n in val_names} if status == "ok" else {}
    payload = {
        "status": status, "error": error, "overrides": overrides, "final_metrics": final, "run_time_s": 10.0 + job,
        "manifest": {"head": head, "k": k, "reduction": "head_mean", "weights": {"name": "uniform"}, "schedule": "sequential"},
        "config": {"seed": seed, "sweep_name": "fake_sweep"}, "cost": {**COSTS[head], **SIZE_PARAMS.get((size, head), {})},
    }
    (run_dir / "run.json").write_text(json.dumps(payload))
    return run_dir


def final_value(name: str, base: float) -> float:
    h = int(name.rsplit("h", 1)[-1]) if "/h" in name else 1
    if name.startswith("decode/accept/p"):
        return round(0.8 / int(name.rsplit("p", 1)[-1]), 6)
    if name.startswith("decode/"):
        return round(1.5 + base / 100, 6)
    if "/acc" in name or "/agree" in name:
        return round(0.5 / h, 6)
    if name == "val/est_tokens_per_forward":
        return round(1.25 + base / 100, 6)
    return round(base + 0.3 * (h - 1), 6)


@pytest.fixture
def fake_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    job = 0
    for head in HEADS:
        for seed in range(3):
            fake_job(sweep, job, head, seed)
            job += 1
    fake_job(sweep, job, "parallel", 3, status="failed", error="FloatingPointError: non-finite loss at step 7")
    return sweep


def digests(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_report_files_rows_and_failure(fake_sweep):
    report = build_sweep_report(fake_sweep)
    rows = list(csv.DictReader((fake_sweep / "runs.csv").open()))
    assert len(rows) == 10 and report.n_ok == 9 and report.n_failed == 1
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["error"] == "FloatingPointError: non-finite loss at step 7"
    assert failed[0]["steps_logged"] == "8" and failed[0]["val/loss"] == ""
    ok = next(r for r in rows if r["head"] == "parallel")
    assert float(ok["val/loss/h4"]) == pytest.approx(final_value("val/loss/h4", 3.1))
    assert ok["overrides"] == "head=parallel seed=0 trainer.max_steps=20" and float(ok["run_time_s"]) > 0
    names = {p.name for p in report.figures}
    assert names == {"val_loss_by_architecture.png", "horizon_loss_curves.png", "horizon_accuracy.png", "grad_cosine.png",
                     "effective_weights.png", "logit_memory.png", "draft_agreement.png", "live_decoding.png",
                     "loss_vs_speedup.png", "final_loss_dots.png", "val_loss_over_training.png"}
    md = (fake_sweep / "report.md").read_text()
    assert "non-finite loss at step 7" in md and "**failed**" in md
    # The validation estimate of tokens per forward is a variant-table column (mean over seeds 0..2).
    header = next(line for line in md.splitlines() if "est tokens/forward (val)" in line)
    column = [c.strip() for c in header.split("|")].index("est tokens/forward (val)")
    parallel_row = next(line for line in md.splitlines() if line.startswith("| head=parallel"))
    assert parallel_row.split("|")[column].strip().startswith(f"{1.25 + 3.11 / 100:.2f}")
    # The decoding section: live tokens/forward and acceptance by draft position next to the estimate.
    section = md.split("## Decoding (live, end of training)")[1].split("## Next-token loss vs decoding speedup")[0]
    header = next(line for line in section.splitlines() if line.startswith("| variant"))
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in next(
        line for line in section.splitlines() if line.startswith("| head=parallel")).split("|")]))
    assert cells["P(prefix≥3) T=1"].startswith(f"{0.8 / 3:.2f}") and cells["tokens/forward T=1"].startswith(f"{1.5 + 3.11 / 100:.2f}")
    assert "head=ntp" not in section
    page = (fake_sweep / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 11 and "Decoding (live, end of training)" in page and "<link" not in page and "src=\"http" not in page


def test_seeds_aggregate_as_mean_and_spread(fake_sweep):
    sweep = collect_sweep(fake_sweep)
    assert sweep_dimensions(sweep.records) == ["head", "seed"]
    groups = {v.label: v for v in variants(sweep.records)}
    assert set(groups) == {"head=ntp", "head=parallel", "head=deepseek"}
    parallel = groups["head=parallel"]
    assert len(parallel.records) == 4 and len(parallel.ok) == 3
    mean, spread, n = parallel.stat("val/loss")
    expected = [3.1 + 0.01 * s for s in range(3)]
    assert n == 3 and mean == pytest.approx(sum(expected) / 3) and spread == pytest.approx(0.01)
    build_report(sweep, fake_sweep)
    md = (fake_sweep / "report.md").read_text()
    assert f"{mean:.4f} ± {spread:.4f}" in md and "3 / 4" in md


def test_rebuild_is_idempotent_byte_for_byte(fake_sweep):
    build_sweep_report(fake_sweep)
    first = digests(fake_sweep)
    build_sweep_report(fake_sweep)
    assert digests(fake_sweep) == first


def test_a_rebuild_removes_what_a_killed_lab_report_left_and_keeps_a_live_writers_temp(fake_sweep):
    """Issue 56: `kill -9` while figures are written leaves `figures/.<name>.<pid>-<hex>.tmp`."""
    build_sweep_report(fake_sweep)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    stale = [fake_sweep / "figures" / f".val_loss.png.{dead}-0123abcd.tmp", fake_sweep / f".report.md.{dead}-89abcdef.tmp"]
    live = fake_sweep / "figures" / f".val_loss.png.{os.getpid()}-00000000.tmp"  # this process is still writing it
    for path in (*stale, live):
        path.write_bytes(b"half a file")
    build_sweep_report(fake_sweep)
    assert not any(path.exists() for path in stale) and live.exists()


@pytest.mark.slow  # 25–50 s of one worker (tests/README.md)
def test_analysis_figures_are_deterministic(fake_sweep, tmp_path):
    runs = [subprocess.run([sys.executable, "-m", "analysis.paper_figures", str(fake_sweep), "--out", str(tmp_path / f"out{i}")],
                           capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT) for i in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    first, second = digests(tmp_path / "out0"), digests(tmp_path / "out1")
    assert first == second
    assert {"table_s4_architectures.tex", "table_s5_step_time.svg", "fig2_memory.pdf", "medusa_head_accuracy.png",
            "deepseek_lambda_effect.csv"} <= set(first)


def wandb_run(head: str, seed: int, state: str = "finished", **summary) -> dict:
    k = HEADS[head]
    base = 3.0 + 0.1 * list(HEADS).index(head) + 0.01 * seed
    final = {f"val/loss/h{h}": final_value(f"val/loss/h{h}", base) for h in range(1, k + 1)}
    final["val/loss"] = final["val/loss/h1"]
    return {
        "id": f"id-{head}-{seed}", "name": f"{head}-k{k}", "state": state, "group": "g", "job_type": head,
        "created_at": f"2026-01-01T00:00:{seed:02d}",
        "config": {"head": {"name": head, "k": k if head != "deepseek" else None, "depth": 3 if head == "deepseek" else None},
                   "reduction": {"policy": "head_mean"}, "weights": {"name": "uniform"}, "schedule": {"name": "sequential"},
                   "seed": seed},
        "summary": {**final, "_runtime": 12.5, **summary},
        "history": [{"_step": 0, "trainer/global_step": step, f"train/loss/h{h}": base + 1 / (step + 1)} for step in range(5) for h in range(1, k + 1)],
    }


def test_wandb_runs_convert_to_the_same_records(tmp_path):
    runs = [wandb_run(head, seed) for head in HEADS for seed in range(2)]
    runs.append(wandb_run("parallel", 2, state="failed", status="failed", error="FloatingPointError: non-finite loss at step 3"))
    runs.append({**wandb_run("ntp", 9), "job_type": "report"})  # the sweep's own report run is left out
    sweep = sweep_from_wandb_runs(runs, source="wandb:e/p/g", name="g")
    assert len(sweep.records) == 7 and len(sweep.failed) == 1
    deepseek = next(r for r in sweep.records if r["head"] == "deepseek")
    assert deepseek["k"] == 4 and deepseek["overrides"] == ["head=deepseek", "head.k=4", "reduction=head_mean", "weights=uniform",
                                                            "schedule=sequential", "seed=0"]
    assert deepseek["status"] == "ok" and deepseek["run_time_s"] == 12.5
    assert deepseek["final"]["val/loss/h4"] == pytest.approx(final_value("val/loss/h4", 3.2))
    assert [s for s, _ in deepseek["history"]["train/loss/h1"]] == [0, 1, 2, 3, 4]
    failed = sweep.failed[0]
    assert failed["error"] == "FloatingPointError: non-finite loss at step 3" and failed["final"] == {}
    groups = {v.label: v for v in variants(sweep.records)}
    assert groups["head=parallel head.k=4"].stat("val/loss")[2] == 2
    report = build_report(sweep, tmp_path / "wandb_report")
    assert report.n_ok == 6 and (tmp_path / "wandb_report" / "report.html").exists()
    crashed = record_from_wandb({**wandb_run("ntp", 0), "state": "crashed"}, 0)
    assert crashed["status"] == "failed" and "crashed" in crashed["error"]
    logged = record_from_wandb({**wandb_run("ntp", 0), "config": {**wandb_run("ntp", 0)["config"], "overrides": ["head=ntp", "seed=0"]}}, 0)
    assert logged["overrides"] == ["head=ntp", "seed=0"]


def test_lab_report_bad_input(tmp_path):
    """The first refusal as a real process, the others through the console entry in this process."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("x")
    assert "not a sweep directory" in one_error_line(lab_report(str(plain)))
    assert "no such directory" in one_error_line(command_in_process("lab-report", str(tmp_path / "missing")))
    dead = tmp_path / "dead"
    dead.mkdir()
    (dead / "multirun.yaml").write_text("hydra: {}\n")
    assert "no completed runs (the sweep has no jobs)" in one_error_line(command_in_process("lab-report", str(dead)))
    fake_job(dead, 0, "ntp", 0, status="failed", error="ValueError: Invalid learning rate: -1")
    fake_job(dead, 1, "ntp", 1, status="failed", error="FloatingPointError: non-finite loss at step 2")
    line = one_error_line(command_in_process("lab-report", str(dead)))
    assert "no completed runs (2 failed" in line and "Invalid learning rate" in line
    assert not (dead / "runs.csv").exists() and not (dead / "report.md").exists()  # nothing half-written
    assert "--group" in one_error_line(command_in_process("lab-report", "--wandb", "entity/project"))
    with pytest.raises(ReportError):
        collect_sweep(plain)


def test_lab_report_cli_rebuilds(fake_sweep):
    result = lab_report(str(fake_sweep))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "9 ok, 1 failed" in result.stdout
    assert not math.isnan(float(next(csv.DictReader((fake_sweep / "runs.csv").open()))["val/loss"]))


def test_cost_table_and_matching_findings(fake_sweep):
    build_sweep_report(fake_sweep)
    md = (fake_sweep / "report.md").read_text()
    assert "| head=parallel | 1.020 M | 2 / 4 / 3 | 10.400 M | 1000 | 1.00× (wall) | 8.0 |" in md  # untimed CPU: no flag
    # (no run measured CPU time or contention: those columns hold no value anywhere, so the table leaves them out)
    assert "| head=ntp | 1.000 M | 6 / 0 / 6 | 10.000 M |" in md
    assert ("Variants differ by more than 5% in parameters from head=ntp (1.000 M): head=deepseek 1.200 M (+20.0%)"
            " — their losses compare models of different size.") in md
    assert ("Variants differ by more than 5% in training FLOPs per token from head=ntp (10.000 M): head=deepseek 11.000 M (+10.0%)"
            " — their losses compare models of different compute.") in md
    assert "head=parallel 1.020 M" not in md  # within 5 %: not named
    rows = list(csv.DictReader((fake_sweep / "runs.csv").open()))
    assert [float(r["params_total"]) for r in rows[:3]] == [1_000_000] * 3 and rows[3]["blocks_trunk"] == "2"
    html = (fake_sweep / "report.html").read_text()
    assert "Cost per variant" in html and "1.200 M" in html


def test_a_job_left_running_is_interrupted_with_its_last_step_unless_its_process_lives(fake_sweep):
    import socket

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # that process has exited
    killed = fake_job(fake_sweep, 10, "ntp", 5, status="running")  # metrics.csv up to step 7
    alive = fake_job(fake_sweep, 11, "ntp", 6, status="running")
    for run_dir, pid in ((killed, dead_pid), (alive, os.getpid())):
        payload = json.loads((run_dir / "run.json").read_text())
        (run_dir / "run.json").write_text(json.dumps({**payload, "pid": pid, "host": socket.gethostname()}))
    records = {r["job"]: r for r in collect_sweep(fake_sweep).records}
    assert records[10]["status"] == "interrupted"
    assert records[10]["error"] == f"interrupted (pid {dead_pid} on {socket.gethostname()} is gone); last logged step 7"
    assert records[11]["status"] == "running" and records[11]["error"].startswith(f"still running (pid {os.getpid()} on")
    build_sweep_report(fake_sweep)
    rows = {r["job"]: r for r in csv.DictReader((fake_sweep / "runs.csv").open())}
    assert rows["10"]["status"] == "interrupted" and rows["10"]["steps_logged"] == "8"
    assert "**interrupted**: interrupted (pid" in (fake_sweep / "report.md").read_text()


def test_lab_report_counts_interrupted_and_not_started_jobs_under_their_own_status(fake_sweep):
    """Issue 38: a killed job and a planned job that never started were counted as `failed`."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = fake_job(fake_sweep, 10, "ntp", 5, status="running")
    payload = json.loads((killed / "run.json").read_text())
    (killed / "run.json").write_text(json.dumps({**payload, "pid": int(gone.stdout)}))
    plan = [{"num": n, "overrides": [f"seed={n}"]} for n in range(12)]  # job 11: planned, no folder
    (fake_sweep / "sweep_plan.json").write_text(json.dumps({"jobs": plan}))
    result = lab_report(str(fake_sweep))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "(9 ok, 1 failed, 1 interrupted, 1 not started; runs.csv" in result.stdout, result.stdout


@pytest.mark.slow  # 25–50 s of one worker (tests/README.md)
def test_two_lab_reports_at_once_on_one_sweep_both_succeed_and_leave_no_temp_file(fake_sweep):
    """Issue 38: both wrote figures/<name>.png.tmp, and one renamed the other's file away (FileNotFoundError)."""
    build_sweep_report(fake_sweep)
    alone = digests(fake_sweep)
    for _ in range(3):
        both = [subprocess.Popen([sys.executable, "-m", "lab.report.cli", str(fake_sweep)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
        for process in both:
            _, err = process.communicate(timeout=SUBPROCESS_TIMEOUT)
            assert process.returncode == 0, err[-2000:]
    assert digests(fake_sweep) == alone  # the same bytes as one report alone, and no temp file beside them


def add_final_metrics(sweep: Path, values_of) -> None:
    """Every completed job's run.json gets the final metrics values_of(head, seed)."""
    for run_json in sweep.glob("*/run.json"):
        payload = json.loads(run_json.read_text())
        if payload["status"] == "ok":
            payload["final_metrics"].update(values_of(payload["manifest"]["head"], payload["config"]["seed"]))
            run_json.write_text(json.dumps(payload))


def test_answer_accuracy_finding_names_the_best_variant(fake_sweep):
    """Synthetic-task runs (val/answer_*): the finding names the best greedy exact match; the table sets it beside teacher forcing."""
    exact = {"ntp": 0.5, "parallel": 0.75, "deepseek": 0.625}
    add_final_metrics(fake_sweep, lambda head, seed: {"val/answer_exact": exact[head], "val/answer_token_acc": 0.8, "val/answer_tf_acc": 0.9})
    build_sweep_report(fake_sweep)
    md = (fake_sweep / "report.md").read_text()
    assert ("- Best answer accuracy (greedy decoding, exact match): **head=parallel** (0.750 ± 0.000). Per variant: "
            "head=ntp 0.500 ± 0.000 (teacher-forced token acc 0.900 ± 0.000); head=parallel 0.750 ± 0.000") in md
    assert "| head=deepseek | deepseek | 4 | 0.625 ± 0.000 | 0.800 ± 0.000 | 0.900 ± 0.000 |" in md  # columns no run logged: left out
    assert "Answer accuracy (synthetic tasks)" in (fake_sweep / "report.html").read_text()
    assert "Clever-Hans" not in md.split("## Findings")[1].split("##")[0]  # no decision metrics: no verdict


def test_the_clever_hans_finding_counts_seeds_by_the_two_standard_error_rule(fake_sweep):
    """n = 256, chance 1/2: 2 SE = 0.0625. ntp sits at chance with every edge followed on all seeds; parallel
    is above chance on all seeds; deepseek is at chance on seeds 0, 1 but misses edges on seed 2 (0.9)."""
    first = {"ntp": [0.48, 0.5, 0.53], "parallel": [0.6, 0.7, 0.8], "deepseek": [0.5, 0.47, 0.5]}
    given = {"ntp": [1.0, 0.99, 1.0], "parallel": [1.0, 1.0, 1.0], "deepseek": [1.0, 1.0, 0.9]}
    add_final_metrics(fake_sweep, lambda head, seed: {
        "val/answer_exact": first[head][seed] * given[head][seed], "val/answer_first_acc": first[head][seed],
        "val/answer_exact_given_first": given[head][seed], "val/answer_first_chance": 0.5, "val/answer_examples": 256.0,
        "val/answer_exact_se": 0.03, "val/answer_token_acc": 0.8, "val/answer_tf_acc": 0.9})
    build_sweep_report(fake_sweep)
    md = (fake_sweep / "report.md").read_text()
    assert ("Clever-Hans signature (decision accuracy within 2 SE of chance 0.500, exact-given-decision within 2 SE of 1) on every "
            "seed: **head=ntp**; decision above chance by > 2 SE on every seed: **head=parallel**.") in md
    assert "head=deepseek: decision 0.490 ± 0.017, exact given it 0.967 ± 0.058, signature in 2/3 seeds, above chance in 0/3" in md
    assert "| head=ntp | ntp | 1 | 0.502 ± 0.026 | 0.030 ± 0.000 | 0.503 ± 0.025 | 0.997 ± 0.006 | 0.800 ± 0.000 | 0.900 ± 0.000 | 256 |" in md


def test_a_sweep_without_answers_has_no_answer_section(fake_sweep):
    build_sweep_report(fake_sweep)
    md = (fake_sweep / "report.md").read_text()
    assert "answer accuracy" not in md.lower() and "## Decoding (live, end of training)" in md


def test_welch_one_sided_p_values_hand_computed():
    from lab.report.significance import welch_less

    # equal variances 1, n = 3: t = -1 / sqrt(2/3) = -1.2247, df = 4; P(T_4 < -1.2247) = 0.1439 (t tables)
    difference, p = welch_less([1, 2, 3], [2, 3, 4])
    assert difference == -1.0 and p == pytest.approx(0.1439, abs=5e-4)
    # unequal variances 0.02333 (n 3) and 0.01667 (n 4): t = -3.8125, Welch df = 3.96; p ≈ 0.0096
    difference, p = welch_less([1.0, 1.1, 1.3], [1.5, 1.4, 1.6, 1.7])
    assert difference == pytest.approx(-0.41667, abs=1e-5) and p == pytest.approx(0.0096, abs=3e-4)
    assert welch_less([2.0, 2.0], [3.0, 3.0]) == (-1.0, 0.0)  # no spread: the sign decides


def test_welch_two_sided_p_values_double_the_one_sided_tail_and_the_interval_holds_the_resampled_means():
    from lab.report.significance import bootstrap_interval, paired, welch

    difference, p = welch([1, 2, 3], [2, 3, 4])  # t = -1.2247, df = 4: two tails of 0.1439
    assert difference == -1.0 and p == pytest.approx(0.2878, abs=1e-3)
    assert welch([3, 4, 5], [2, 3, 4])[1] == pytest.approx(0.2878, abs=1e-3)  # the other direction: the same p
    low, high = bootstrap_interval([1.0, 1.2], [2.0, 2.2])
    assert -1.2 - 1e-9 <= low < -1.0 < high <= -0.8 + 1e-9  # resampled means differ by −1.2 … −0.8; −1.0 is the most likely
    # seeds 0, 1, 2: differences −0.1, −0.2, −0.3 → mean −0.2, sd 0.1; t = −0.2 / (0.1/√3) = −3.464, df 2: p = 0.0742
    mean, sd, p = paired({0: 0.9, 1: 0.8, 2: 0.7}, {0: 1.0, 1: 1.0, 2: 1.0})
    assert (mean, sd) == (pytest.approx(-0.2), pytest.approx(0.1)) and p == pytest.approx(0.0742, abs=5e-4)
    assert paired({0: 1.0, 1: 1.0}, {1: 1.0, 2: 1.0}) is None  # other seeds: no pairs


def test_findings_state_the_difference_to_ntp_with_a_two_sided_welch_p(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for job, (head, seed, shift) in enumerate([(h, s, -0.105 if h == "parallel" else 0.0) for h in ("ntp", "parallel") for s in range(3)]):
        fake_job(sweep, job, head, seed, shift=shift)
    build_sweep_report(sweep)
    md = (sweep / "report.md").read_text()
    line = next(line for line in md.splitlines() if "two-sided Welch t-test" in line)
    # parallel: 2.995 + 0.01·seed vs ntp 3.0 + 0.01·seed → −0.005; t = −0.6124, df = 4, two-sided p = 2 × 0.2868
    assert "head=parallel -0.0050 [" in line and "(n = 3 vs 3, p = 0.573; seed-paired -0.0050 ± 0.0000" in line, line


def test_scaling_report_on_a_two_size_two_variant_sweep(tmp_path):
    """size ∈ {a, b} × head ∈ {ntp, parallel} × seeds 0, 1: the figure, the table and Δ = the runs' own differences."""
    sweep = tmp_path / "scaling"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    shifts = {("a", "ntp"): 0.0, ("a", "parallel"): 0.3, ("b", "ntp"): -1.0, ("b", "parallel"): -1.35}
    job = 0
    for size in ("b", "a"):  # out of order: the report sorts sizes by parameters
        for head in ("ntp", "parallel"):
            for seed in (0, 1):
                fake_job(sweep, job, head, seed, shift=shifts[size, head] + (0.02 * seed if head == "parallel" else 0.0), size=size)
                job += 1
    report = build_sweep_report(sweep)
    assert {p.name for p in report.figures} >= {"scaling_loss_difference.png", "scaling_tokens_per_forward.png"}
    loss = {tuple(o for o in r["overrides"] if not o.startswith("trainer")): r["final"]["val/loss"] for r in collect_sweep(sweep).records}
    by = lambda size, head, seed: loss[(f"head={head}", f"seed={seed}", f"size={size}")]  # noqa: E731
    deltas = {size: [by(size, "parallel", seed) - by(size, "ntp", seed) for seed in (0, 1)] for size in ("a", "b")}
    # fake_job: val/loss = 3.0 + 0.1·(head index) + shift + 0.01·seed; the seed term cancels in a same-seed pair
    assert deltas["a"] == pytest.approx([0.1 + 0.3, 0.1 + 0.3 + 0.02]) and deltas["b"] == pytest.approx([0.1 - 0.35, 0.1 - 0.35 + 0.02])
    md = (sweep / "report.md").read_text()
    section = md.split("## Scaling (loss difference to ntp by model size)")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| a ") or line.startswith("| b ")]
    assert [r.split("|")[1].strip() for r in rows] == ["a", "a", "b", "b"]  # 0.2 M before 2 M, ntp first in a size
    for size in ("a", "b"):
        mean, sd = statistics.fmean(deltas[size]), statistics.stdev(deltas[size])
        assert f"| {size} | head=parallel | {0.21 if size == 'a' else 2.1:.3f} M |" in section
        assert f"| {mean:+.4f} ± {sd:.4f} | 2 |" in section, (size, section)
    assert f"head=parallel: a (0.21 M) {statistics.fmean(deltas['a']):+.4f}" in md


def test_history_csv_holds_every_logged_value_in_long_format(fake_sweep):
    build_sweep_report(fake_sweep)
    with (fake_sweep / "history.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["job", "variant", "seed", "overrides", "step", "metric", "value"]
    records = collect_sweep(fake_sweep).records
    expected = sum(len(series) for record in records for series in record["history"].values())
    assert len(rows) == expected
    job4 = {(int(r["step"]), r["metric"]): float(r["value"]) for r in rows if r["job"] == "4"}
    history = records[4]["history"]
    assert job4 == {(step, metric): value for metric, series in history.items() for step, value in series}
    assert {r["variant"] for r in rows if r["job"] == "4"} == {"head=parallel"} and {r["seed"] for r in rows if r["job"] == "4"} == {"1"}


def test_runs_csv_has_each_gradient_cosines_mean_over_steps(fake_sweep):
    build_sweep_report(fake_sweep)
    with (fake_sweep / "runs.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    parallel = next(r for r in rows if r["job"] == "3")  # K = 4: six pairs, each logged as 0.1 × its second horizon
    assert {name for name in parallel if name.endswith("/mean_over_steps")} == {
        f"grad/cos/leaf/h{i}_h{j}/mean_over_steps" for i in range(1, 5) for j in range(i + 1, 5)}
    assert math.isclose(float(parallel["grad/cos/leaf/h3_h4/mean_over_steps"]), 0.4)
    assert next(r for r in rows if r["job"] == "0")["grad/cos/leaf/h1_h2/mean_over_steps"] == ""  # ntp: one horizon, no pair

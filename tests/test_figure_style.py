"""Figures a reader can trust (issue #69 item 6): no text on text (checked from the SVGs' text boxes), one colour per
variant in every figure, horizons never in a variant's colour, axes that show the differences, validation steps as
they ran, readable labels and `--label`, and the two seed figures (loss over training with bands, final-loss dots).

The sweep is the researcher's grid as `lab-train -m head=ntp,parallel,deepseek head.k=2,4 seed=0,1
trainer.max_steps=150` leaves it (10 jobs): metrics.csv laid out as Lightning writes it — training values under their
batch index (4, 9, …, 149), the validations at steps 75 and 150 under 74 and 149, the end-of-run throughput and
decoding rows under 150 — and run.json with its head traits and last attempt's step. Built and reported once.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest
from matplotlib.colors import to_hex

import lab.report.plotting as plotting
from analysis.paper_figures import regenerate
from lab.report.build import build_sweep_report
from lab.report.plotting import PALETTE, also_save_as, figure, save_png
from lab.report.text_boxes import overlapping_texts
from tests.cli import command_in_process, one_error_line

STEPS, VALIDATIONS = 150, (75, 150)
GRID = [("ntp", 1), ("parallel", 2), ("parallel", 4), ("deepseek", 2), ("deepseek", 4)]
TRAITS = {"ntp": (True, False, 0), "parallel": (False, False, 2), "deepseek": (False, True, 5)}
LABEL = {("ntp", 1): "ntp", ("parallel", 2): "parallel K=2", ("parallel", 4): "parallel K=4",
         ("deepseek", 2): "deepseek K=2", ("deepseek", 4): "deepseek K=4"}


def val_loss(head: str, k: int, seed: int, step: int) -> float:
    return round(2.9 + 0.04 * (head == "parallel") * k - 0.02 * (head == "deepseek") + 0.015 * seed + 30.0 / step, 6)


def accuracy(head: str, k: int, h: int, seed: int) -> float:
    """0.21–0.29, as the researcher's 150-step runs: blind heads fall with the horizon, teacher-forced depths less."""
    return round(0.29 - (0.02 if head == "deepseek" else 0.03) * (h - 1) - 0.004 * seed, 6)


def write_job(sweep: Path, job: int, head: str, k: int, seed: int) -> None:
    overrides = [f"head={head}", *([f"head.k={k}"] if head != "ntp" else []), f"seed={seed}", f"trainer.max_steps={STEPS}"]
    run_dir = sweep / f"{job}-{head}-k{k}-s{seed}"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run_dir / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  job:\n    num: {job}\n")
    pairs = [(i, j) for i in range(1, k + 1) for j in range(i + 1, k + 1)]
    rows = []
    for index in range(4, STEPS, 5):  # log_every_n_steps=5: batch indices 4, 9, …, 149
        row = {"step": index, "train/loss": 3.5 - index / 300 + 0.01 * seed}
        row.update({f"train/loss/h{h}": 3.5 + 0.2 * (h - 1) - index / 300 for h in range(1, k + 1)})
        row.update({f"train/weight_eff/h{h}": 1.0 / k for h in range(1, k + 1)})
        row.update({f"grad/cos/leaf/h{i}_h{j}": 0.3 - 0.05 * j + index / 3000 for i, j in pairs})
        row.update({"mem/logits_live_bytes": 2.0e6 * k, "mem/saved_peak_bytes": 1.0e8 + 1.0e7 * k})
        rows.append(row)
    final: dict[str, float] = {}
    for step in VALIDATIONS:  # Lightning logs a validation after batch i (= after i + 1 steps) under i
        values = {"val/loss": val_loss(head, k, seed, step), "val/bpb": val_loss(head, k, seed, step) / 0.69}
        for h in range(1, k + 1):
            values[f"val/loss/h{h}"] = val_loss(head, k, seed, step) + 0.15 * (h - 1)
            values[f"val/acc/h{h}"] = accuracy(head, k, h, seed) - (0.01 if step < STEPS else 0.0)
            values[f"val/chain_acc/h{h}"] = accuracy(head, k, h, seed) + 0.2 * (h > 1)
        for h in range(2, k + 1):
            values[f"val/agree/h{h}"] = 0.6 - 0.05 * h
            values[f"val/agree_chain/h{h}"] = 0.65 - 0.03 * h
        if k > 1:
            values["val/est_tokens_per_forward"] = 1.3 + 0.1 * k
        rows.append({"step": step - 1, **values})
        final.update(values)
    end = {"train/contended": 0.0, "train/cpu_share": 0.98}
    if k > 1:  # the end-of-run decoding evaluation, logged at trainer.global_step
        end.update({f"decode/accept/p{j}": round(0.75 / j, 4) for j in range(1, k)})
        end.update({f"decode/accept_cond/p{j}": round(0.75 - 0.02 * j, 4) for j in range(1, k)})
        end.update({"decode/tokens_per_forward": 1.4 + 0.2 * k, "decode/greedy/tokens_per_forward": 1.5 + 0.2 * k,
                    "decode/distinct4": 0.71, "decode/degenerate": 0.0, "decode/prompts_clean": 4.0,
                    "decode/greedy/distinct4": 0.02, "decode/greedy/degenerate": 1.0, "decode/greedy/prompts_clean": 0.0,
                    "decode/speedup": 1.05 + 0.04 * k + 0.01 * seed})
    rows.append({"step": STEPS, **end})
    final.update(end)
    names = sorted({name for row in rows for name in row if name != "step"})
    with (run_dir / "metrics.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["epoch", "step", *names])
        writer.writeheader()
        writer.writerows({"epoch": 0, **row} for row in rows)
    baseline, forced, rank = TRAITS[head]
    payload = {
        "status": "ok", "error": None, "overrides": overrides, "final_metrics": final, "run_time_s": 30.0 + job, "k": k,
        "head_traits": {"baseline": baseline, "teacher_forced": forced, "display_rank": rank},
        "manifest": {"head": head, "k": k, "reduction": "head_mean", "weights": {"name": "uniform"}, "schedule": "sequential"},
        "config": {"seed": seed, "sweep_name": "grid"}, "attempts": [{"attempt": 1, "status": "ok", "step": STEPS}],
        "cost": {"params_total": 600_000 + 50_000 * k * (head != "ntp"), "train_flops_per_token": 4.9e6 + 0.25e6 * k,
                 "train_process_cpu_s": 50.0 + 4.0 * k + seed, "train_tokens_per_s": 4000.0 - 150 * k, "train_time_s": 50.0 + 4 * k},
    }
    (run_dir / "run.json").write_text(json.dumps(payload))


def write_grid(root: Path) -> Path:
    sweep = root / "grid"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for job, ((head, k), seed) in enumerate((cell, seed) for cell in GRID for seed in (0, 1)):
        write_job(sweep, job, head, k, seed)
    return sweep


def legend_entries(fig) -> list[tuple[str, str]]:
    """(legend text on one line, the colour of its handle) of every legend of a figure."""
    out = []
    for legend in [ax.get_legend() for ax in fig.axes] + list(fig.legends):
        if legend is None:
            continue
        for handle, text in zip(legend.legend_handles, legend.get_texts()):
            if hasattr(handle, "get_color") and not hasattr(handle, "get_facecolor"):
                colour = handle.get_color()
            elif hasattr(handle, "get_facecolor") and len(handle.get_facecolor()) and handle.get_facecolor()[-1] != 0:
                colour = handle.get_facecolor()[0] if hasattr(handle.get_facecolor()[0], "__len__") else handle.get_facecolor()
            else:
                colour = handle.get_edgecolor()
            out.append((" ".join(text.get_text().split()), to_hex(colour)))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The grid's report (figures also as SVG) and paper figures; what every saved figure drew (legends, axes)."""
    root = tmp_path_factory.mktemp("figures")
    sweep = write_grid(root)
    drawn: dict[str, dict] = {}
    save = plotting._save

    def recording(fig, path, format):
        key = f"{Path(path).parent.name}/{Path(path).stem}"
        drawn.setdefault(key, {"legend": legend_entries(fig), "axes": [
            {"xlim": ax.get_xlim(), "ylim": ax.get_ylim(), "title": ax.get_title(), "legend": legend_entries_of(ax),
             "points": [tuple(map(float, xy)) for line in ax.lines for xy in line.get_xydata()]} for ax in fig.axes]})
        return save(fig, path, format)

    mp = pytest.MonkeyPatch()
    mp.setattr(plotting, "_save", recording)
    try:
        with also_save_as("svg"):
            report = build_sweep_report(sweep)
        paper = regenerate(sweep, root / "paper")
    finally:
        mp.undo()
    return {"sweep": sweep, "paper": root / "paper", "report": report, "written": paper, "drawn": drawn}


def legend_entries_of(ax) -> list[tuple[str, str]]:
    legend = ax.get_legend()
    return [] if legend is None else [(" ".join(t.get_text().split()), "") for t in legend.get_texts()]


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_no_two_texts_overlap_in_any_report_or_paper_figure(built):
    svgs = sorted((built["sweep"] / "figures").glob("*.svg")) + sorted(built["paper"].glob("*.svg"))
    assert {p.stem for p in svgs} >= {"live_decoding", "loss_vs_speedup", "quality_vs_cost", "medusa_head_accuracy",
                                      "horizon_accuracy_over_training", "val_loss_over_training", "final_loss_dots"}
    collisions = {p.parent.name + "/" + p.name: overlapping_texts(p) for p in svgs}
    assert not {name: pairs for name, pairs in collisions.items() if pairs}


def test_the_overlap_check_fails_on_a_figure_with_a_colliding_label(tmp_path):
    with figure(4.0, 3.0) as (fig, axes):
        ax = axes[0][0]
        ax.plot([0, 1], [0, 1], label="parallel K=4")
        ax.set_title("a title")
        ax.text(0.5, 1.0, "a label on the title", transform=ax.transAxes, ha="center", va="bottom")  # the perturbation
        save_png(fig, tmp_path / "bad.svg", "svg")
    assert overlapping_texts(tmp_path / "bad.svg") == [("a label on the title", "a title")]


def test_validations_are_drawn_at_the_steps_they_ran_and_the_jobs_table_counts_training_steps(built):
    history = read_csv(built["sweep"] / "history.csv")
    assert {int(r["step"]) for r in history if r["metric"] == "val/acc/h1"} == set(VALIDATIONS)
    drawn = read_csv(built["paper"] / "horizon_accuracy_over_training.csv")
    assert {int(r["step"]) for r in drawn} == set(VALIDATIONS)
    parallel = [r for r in drawn if r["variant"] == "parallel K=4" and r["metric"] == "val/acc" and r["horizon"] == "1"]
    expected = [accuracy("parallel", 4, 1, s) - 0.01 for s in (0, 1)]  # the first validation, both seeds
    first = next(r for r in parallel if r["step"] == "75")
    assert float(first["mean"]) == pytest.approx(statistics.fmean(expected)) and float(first["sd"]) == pytest.approx(statistics.stdev(expected))
    assert first["n"] == "2"
    assert {r["steps_logged"] for r in read_csv(built["sweep"] / "runs.csv")} == {str(STEPS)}
    assert f"| {STEPS} |" in (built["sweep"] / "report.md").read_text()


def test_one_colour_per_variant_across_figures_and_horizons_never_in_a_variant_colour(built):
    colour_of: dict[str, set] = {}
    for name, fig in built["drawn"].items():
        for text, colour in fig["legend"]:
            variant = next((label for label in LABEL.values() if text == label or text.startswith(label + " ")), None)
            if variant is not None:
                colour_of.setdefault(variant, set()).add((name, colour))
            else:  # horizons, pairs, bar kinds, baseline lines: not a variant's colour
                assert colour not in [c.lower() for c in PALETTE], (name, text, colour)
    for variant, seen in colour_of.items():
        assert len({colour for _, colour in seen}) == 1, (variant, seen)
    shared = [variant for variant, seen in colour_of.items() if len({name for name, _ in seen}) >= 2]
    assert set(shared) >= {"parallel K=4", "deepseek K=4"}, colour_of


def test_axes_show_the_differences_and_teacher_forced_heads_have_their_own_panel(built):
    quality = built["drawn"]["paper/quality_vs_cost"]["axes"][0]
    xs = [x for x, _ in quality["points"]]
    low, high = quality["xlim"]
    assert low > 0 and (min(xs) - low) / (high - low) < 0.25 and (high - max(xs)) / (high - low) < 0.25  # not all in the right fifth
    medusa = built["drawn"]["paper/medusa_head_accuracy"]["axes"]
    titles = [ax["title"] for ax in medusa]
    assert len(medusa) == 2 and "blind" in titles[0] and "teacher-forced" in titles[1]
    assert {t for t, _ in medusa[0]["legend"]} == {"parallel K=2", "parallel K=4"}
    assert {t for t, _ in medusa[1]["legend"]} == {"deepseek K=2", "deepseek K=4"}
    for ax in medusa:  # accuracies 0.20–0.29: the axis spans them, not 0–1
        assert ax["ylim"][1] - ax["ylim"][0] < 0.3 and ax["ylim"][0] > 0.1


def test_figures_show_readable_labels_and_the_new_figures_state_their_seeds(built):
    from tests.test_paper_figures import svg_text

    for svg in [*(built["sweep"] / "figures").glob("*.svg"), *built["paper"].glob("*.svg")]:
        assert "head=" not in svg_text(svg), svg.name
    assert "parallel K=4" in svg_text(built["paper"] / "final_loss_dots.svg")
    dots = read_csv(built["paper"] / "final_loss_dots.csv")
    order = list(dict.fromkeys(r["variant"] for r in dots))
    means = {label: statistics.fmean(val_loss(h, k, s, STEPS) for s in (0, 1)) for (h, k), label in LABEL.items()}
    assert order == sorted(means, key=means.get)  # best first
    assert {r["variant"] for r in dots if r["baseline"] == "True"} == {"ntp"} and len(dots) == 10
    curve = read_csv(built["paper"] / "val_loss_over_training.csv")
    ntp = {int(r["step"]): r for r in curve if r["variant"] == "ntp"}
    assert set(ntp) == set(VALIDATIONS) and ntp[150]["n"] == "2"
    assert float(ntp[150]["sd"]) == pytest.approx(statistics.stdev(val_loss("ntp", 1, s, 150) for s in (0, 1)))
    legend = [t for t, _ in built["drawn"]["figures/val_loss_over_training"]["legend"]]
    assert "ntp (baseline) (n=2)" in legend and "parallel K=4 (n=2)" in legend


def test_label_renames_a_variant_in_every_figure_table_and_finding(built, tmp_path):
    out = tmp_path / "renamed"
    done = command_in_process("lab-report", str(built["sweep"]), "--out", str(out), "--label", "head=parallel head.k=4=Parallel four",
                              "--label", "deepseek K=2=DeepSeek two")
    assert done.returncode == 0, done.stderr
    md = (out / "report.md").read_text()
    assert "| Parallel four | parallel | 4 |" in md and "Highest: **Parallel four**" in md and "DeepSeek two" in md
    old = [line for line in md.splitlines() if "head=parallel head.k=4" in line or "head=deepseek head.k=2" in line]
    assert old and all(" seed=" in line for line in old), old  # only the jobs table's overrides keep the settings


def test_a_label_naming_no_variant_is_one_line_exit_2_and_writes_nothing(built, tmp_path):
    out = tmp_path / "never"
    done = command_in_process("lab-report", str(built["sweep"]), "--out", str(out), "--label", "head=medusa=Medusa")
    line = one_error_line(done)
    assert line.startswith("error: --label: 'head=medusa' names no variant; allowed: head=ntp, head=parallel head.k=2")
    assert not out.exists()


def test_a_point_label_on_the_legend_is_moved_off_it_before_saving(tmp_path):
    with figure(4.0, 3.0) as (fig, axes):
        ax = axes[0][0]
        for i, name in enumerate(("ntp", "parallel K=4", "deepseek K=4")):
            ax.plot([0, 1], [i, i + 0.1], label=name)
        ax.legend(loc="upper right")
        legend_text = ax.get_legend().get_texts()[0]
        fig.canvas.draw()
        where = ax.transData.inverted().transform(legend_text.get_window_extent(fig.canvas.get_renderer()).p0)
        ax.annotate("a point label", tuple(where), xytext=(0, 0), textcoords="offset points", fontsize=7)  # on "ntp"
        save_png(fig, tmp_path / "moved.svg", "svg")
    assert overlapping_texts(tmp_path / "moved.svg") == []

"""The report's decoding and head figures (synthetic job dirs): one colour per variant in every figure,
DeepSeek's teacher-forced accuracy on its own labelled axis, the T=1 headline with its degenerate flag,
and next-token loss against measured speedup with the runs' own numbers."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.colors as mcolors
import pytest

import lab.report.sweep_figures as sweep_figures
from lab.report.build import build_sweep_report
from lab.report.plotting import variant_style
from lab.report.records import collect_sweep
from lab.report.render import decoding_table, loss_speedup_table
from lab.report.speeds import SPEEDUP_HEADER
from lab.report.sweep_figures import loss_speedup_points, variant_styles
from lab.report.table import variants
from tests.browser import layout, needs_chromium

# head -> (K, val/loss, decode/speedup, decode/tokens_per_forward, decode/degenerate); ntp decodes plainly
JOBS = {
    "ntp": (1, 3.10, None, 1.0, 0.0),
    "linear": (4, 3.25, 1.8, 2.6, 0.0),
    "parallel": (4, 3.20, 1.4, 2.1, 0.25),
    "deepseek": (4, 3.15, None, None, 1.0),  # every T=1 continuation degenerate: no headline
}


def final_metrics(head: str) -> dict:
    k, loss, speedup, per_forward, degenerate = JOBS[head]
    final = {"val/loss": loss, "val/bpb": loss / 0.69, "decode/distinct4": 0.15 if degenerate == 1.0 else 0.8,
             "decode/degenerate": degenerate, "decode/prompts_clean": 4 * (1 - degenerate),
             "decode/greedy/distinct4": 0.1, "decode/greedy/degenerate": 1.0}
    for h in range(1, k + 1):
        final[f"val/loss/h{h}"] = loss + 0.3 * (h - 1)
        final[f"val/acc/h{h}"] = 0.9 if head == "deepseek" else 0.5 / h  # teacher-forced depths score high
        final[f"val/chain_acc/h{h}"] = 0.4
    for h in range(2, k + 1):
        final[f"val/agree/h{h}"] = final[f"val/agree_chain/h{h}"] = 0.3
    if per_forward is not None:
        final["decode/tokens_per_forward"] = per_forward
        final["decode/mean_accepted"] = 1.2
        final["decode/mean_accept_len"] = 2.2
    if speedup is not None:
        final["decode/speedup"] = speedup
        for j in range(1, k):
            final[f"decode/accept/p{j}"] = 0.8 ** j
            final[f"decode/accept_cond/p{j}"] = 0.8
        final.update({"decode/path_accept": 0.55, "decode/top1_all": 0.5, "decode/frechet_lower": 0.4, "decode/frechet_upper": 0.7})
    return final


def write_sweep(root: Path, heads) -> Path:
    root.mkdir()
    (root / "multirun.yaml").write_text("hydra: {}\n")
    for job, head in enumerate(heads):
        run_dir = root / f"{job}-{head}"
        (run_dir / ".hydra").mkdir(parents=True)
        overrides = [f"head={head}"]
        (run_dir / ".hydra" / "overrides.yaml").write_text(f"- head={head}\n")
        (run_dir / "metrics.csv").write_text("epoch,step,train/loss/h1\n0,0,3.5\n0,1,3.4\n")
        payload = {"status": "ok", "overrides": overrides, "final_metrics": final_metrics(head), "run_time_s": 1.0,
                   "manifest": {"head": head, "k": JOBS[head][0]}, "config": {"seed": 0, "sweep_name": "decoding"}}
        (run_dir / "run.json").write_text(json.dumps(payload))
    return root


@pytest.fixture
def drawn(tmp_path, monkeypatch):
    """Build the report and keep, per figure, every axis's (title, {legend label: colour}) as drawn."""
    seen = {}
    real_save = sweep_figures.save_png

    def spy(fig, path):
        axes = []
        for ax in fig.axes:
            colours = {}
            for line in ax.get_lines():
                if not line.get_label().startswith("_"):
                    colours[line.get_label()] = mcolors.to_hex(line.get_color())
            for container in ax.containers:  # errorbar containers carry the label, their line the colour
                label = container.get_label()
                if not label.startswith("_") and getattr(container, "lines", None) and container.lines[0] is not None:
                    colours[label] = mcolors.to_hex(container.lines[0].get_color())
            axes.append((ax.get_title(), colours))
        seen[Path(path).name] = axes
        return real_save(fig, path)

    monkeypatch.setattr(sweep_figures, "save_png", spy)
    # ntp first in job order: with colours by position among the variants a figure shows, linear
    # would be the second colour where ntp is drawn (accuracy) and the first where it is not (agreement).
    sweep = write_sweep(tmp_path / "sweep", ["ntp", "linear", "parallel", "deepseek"])
    report = build_sweep_report(sweep)
    return sweep, report, seen


def test_a_variant_has_one_colour_in_every_figure(drawn):
    _, _, seen = drawn
    colours: dict[str, set] = {}
    for axes in seen.values():
        for _, drawn_colours in axes:
            for label, colour in drawn_colours.items():
                colours.setdefault(label.removesuffix(" (plain)"), set()).add(colour)
    assert {"linear", "parallel", "deepseek", "ntp"} <= set(colours)  # figures show readable labels (lab/report/labels.py)
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({next(iter(c)) for c in colours.values()}) == len(colours)  # and different variants differ
    assert {"horizon_accuracy.png", "draft_agreement.png", "live_decoding.png", "loss_vs_speedup.png"} <= set(seen)


def test_variant_styles_follow_the_head_order_not_the_subset_drawn(tmp_path):
    groups = variants(collect_sweep(write_sweep(tmp_path / "s", ["deepseek", "parallel", "linear", "ntp"])).records)
    styles = variant_styles(groups)
    assert styles["head=ntp"] == variant_style(0) and styles["head=linear"] == variant_style(1)
    assert styles["head=parallel"] == variant_style(2) and styles["head=deepseek"] == variant_style(3)
    assert variant_styles(list(reversed(groups))) == styles  # the registry's order, not the order the runs came in


def test_teacher_forced_accuracy_never_shares_an_axis_with_blind_heads(drawn):
    _, _, seen = drawn
    axes = seen["horizon_accuracy.png"]
    with_deepseek = [(title, c) for title, c in axes if "deepseek" in c]
    assert with_deepseek and all(set(c) == {"deepseek"} for _, c in with_deepseek)
    assert all("teacher-forced" in title for title, _ in with_deepseek)
    blind = [(title, c) for title, c in axes if "linear" in c]
    assert blind and all("blind" in title and "deepseek" not in c for title, c in blind)


def test_decoding_table_leads_with_t1_and_flags_degenerate_runs(drawn):
    sweep, _, _ = drawn
    header, rows = decoding_table(variants(collect_sweep(sweep).records))
    assert header[3] == "tokens/forward T=1"
    by_variant = {row[0]: dict(zip(header, row)) for row in rows}
    assert by_variant["head=linear"]["tokens/forward T=1"] == "2.60" and by_variant["head=linear"][SPEEDUP_HEADER] == "1.80"  # no quartiles, no flag recorded
    assert by_variant["head=linear"]["P(prefix≥2) T=1"] == "0.64" and by_variant["head=linear"]["P(2 | 1..1) T=1"] == "0.80"
    assert by_variant["head=parallel"]["degenerate T=1"] == "0.25 DEGENERATE" and by_variant["head=linear"]["degenerate T=1"] == "0.00"
    assert by_variant["head=deepseek"]["tokens/forward T=1"] == "— (all degenerate)"
    assert by_variant["head=ntp"]["mean accept len (with bonus, τ)"] == "2.20"
    assert by_variant["head=linear"]["path accept T=1"] == "0.55" and by_variant["head=linear"]["top-1 all in [Fréchet] T=1"] == "0.50 in [0.40, 0.70]"
    assert by_variant["head=ntp"]["top-1 all in [Fréchet] T=1"] == "—"
    md = (sweep / "report.md").read_text()
    assert "*unconditional* (`decode/accept/p{j}`" in md and "*conditional*" in md and "τ" in md
    assert "max(0, Σa_j − J + 1) ≤ P(all) ≤ min a_j" in md and "`decode/path_accept`" in md
    assert "| head=deepseek | deepseek | 4 | — (all degenerate) |" in md


def test_loss_against_speedup_figure_and_table_hold_the_runs_values(drawn):
    sweep, report, seen = drawn
    assert (sweep / "figures" / "loss_vs_speedup.png").exists() and any(p.name == "loss_vs_speedup.png" for p in report.figures)
    points = {p.variant.label: p for p in loss_speedup_points(variants(collect_sweep(sweep).records))}
    # deepseek measured no speedup (all degenerate): no point; ntp sits at 1x as plain decoding
    assert set(points) == {"head=ntp", "head=linear", "head=parallel"}
    for head in ("linear", "parallel"):
        run = json.loads(next(sweep.glob(f"*-{head}")).joinpath("run.json").read_text())["final_metrics"]
        assert (points[f"head={head}"].loss, points[f"head={head}"].speedup) == (run["val/loss"], run["decode/speedup"])
    assert points["head=ntp"].speedup == 1.0 and not points["head=ntp"].measured
    header, rows = loss_speedup_table(list(p.variant for p in points.values()))
    table = {row[0]: row for row in rows}
    assert table["head=linear"][3:5] == ["3.2500", "1.800"] and table["head=ntp"][4] == "1 (plain decoding)"
    md = (sweep / "report.md").read_text()
    assert "## Next-token loss vs decoding speedup" in md and "| head=parallel | parallel | 4 | 3.2000 | 1.400 |" in md
    assert set(seen["loss_vs_speedup.png"][0][1]) == {"ntp (plain)", "linear", "parallel"}  # the figure's readable labels


def test_a_wide_html_table_is_split_into_column_groups_that_each_repeat_the_label(drawn):
    sweep, _, _ = drawn
    page = (sweep / "report.html").read_text()
    assert 'class="scroll"' not in page
    decoding = page.split("<h2>Decoding (live, end of training)</h2>")[1].split("<h2>")[0]
    parts = decoding.count("<table>")
    assert parts >= 2 and decoding.count(f"columns 1 of {parts}") == 1
    assert all(table.split("<th>")[1].startswith("variant</th>") for table in decoding.split("<table>")[1:])


@needs_chromium
def test_wide_tables_and_long_lines_stay_inside_the_page_at_1400_and_900_px(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", ["ntp", "linear", "parallel", "deepseek"])
    failed = sweep / "4-broken"
    (failed / ".hydra").mkdir(parents=True)
    (failed / ".hydra" / "overrides.yaml").write_text("- head=causal\n")
    error = "FileNotFoundError: /data/" + "x" * 200 + "/last.ckpt"  # one unbreakable word far wider than the page
    (failed / "run.json").write_text(json.dumps({"status": "failed", "error": error, "overrides": ["head=causal"], "manifest": {"head": "causal", "k": 8}}))
    report = build_sweep_report(sweep)
    seen = layout(report.html, 1400)
    assert seen["scroll"] <= seen["viewport"] and seen["hidden"] == [], seen  # every column and word visible
    seen = layout(report.html, 900)
    assert seen["scroll"] <= seen["viewport"], seen  # narrower: a table may scroll inside its box, the page does not


def test_tables_and_findings_label_teacher_forced_numbers(drawn):
    sweep, _, _ = drawn
    md = (sweep / "report.md").read_text()
    table = md.split("## Variants (mean ± sd over seeds)")[1].split("\n## ")[0]
    header = next(line for line in table.splitlines() if line.startswith("| variant"))
    columns = [c.strip() for c in header.split("|")]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")] for line in table.splitlines() if line.startswith("| head=")}
    acc = {k: columns.index(f"val/acc/h{k}") for k in (1, 4)}
    assert rows["head=deepseek"][acc[4]] == "0.900 TF" and rows["head=deepseek"][acc[1]] == "0.900"  # h1 is the next token: blind
    assert rows["head=linear"][acc[4]] == "0.125" and "TF = teacher-forced" in table
    farthest = next(line for line in md.splitlines() if "Top-1 accuracy at the farthest horizon" in line)
    assert "head=deepseek: h4 0.900 TF" in farthest and "head=linear: h4 0.125;" in farthest

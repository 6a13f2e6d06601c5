"""Gradient conflict answered (issue #69 item 4): the findings on grad/cos histories (lab/report/gradient_conflict.py),
the figure the report and the paper share (lab/report/conflict_figure.py), and the pre-flight note on swept loss
weightings that differ only by a constant factor (lab/run/equivalent_settings.py).

Oracles are hand-computed: a series of 9 logged steps splits into thirds of 3, so a cosine of −0.20 on the first
three steps and +0.10 (seed 0) / +0.12 (seed 1) on the last three is −0.20 → +0.11, Δ = +0.31 ± sd(0.30, 0.32) = 0.01.
"""

from __future__ import annotations

import csv

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lab.callbacks.grad_diagnostics import GradDiagnostics
from lab.report.gradient_conflict import conflict_series
from lab.report.records import Sweep, empty_record
from lab.report.render import findings
from lab.report.table import variants
from lab.run.equivalent_settings import equivalence_notes
from lab.run.grid_sweeper import GridSweeper
from lab.train import CONF_DIR
from tests.helpers import packed_batch

STEPS = range(9)


def job(reduction: str, seed: int, leaf: list[float]) -> dict:
    record = empty_record()
    record.update(status="ok", job=seed, head="parallel", k=2, seed=seed, overrides=[f"reduction={reduction}", f"seed={seed}"])
    record["history"] = {
        "grad/cos/h1_h2": list(zip(STEPS, leaf)),  # the trunk output: the callback logs it without a prefix
        "grad/cos/embed/h1_h2": [(s, 0.5) for s in STEPS],
        "grad/cos/unembed/h1_h2": [(s, 0.5) for s in STEPS],  # tied: the same tensor, the same numbers
        "grad/cos/trunk_last/h1_h2": [(s, 0.4) for s in STEPS],
    }
    return record


def rising(late: float) -> list[float]:
    return [-0.2] * 3 + [0.0] * 3 + [late] * 3


@pytest.fixture
def records() -> list[dict]:
    return [job("head_mean", 0, rising(0.10)), job("head_mean", 1, rising(0.12)),
            job("sum", 0, [-0.30] * 9), job("sum", 1, [-0.32] * 9)]


def test_the_findings_give_sign_trend_and_seed_spread_per_variant_space_and_pair(records):
    found = findings(Sweep("s", "s", records), variants(records))
    head_mean = next(line for line in found if line.startswith("Gradient cosine between horizons, **reduction=head_mean**"))
    assert "Δ ± sd over 2 seeds" in head_mean
    assert "trunk output: h1–h2 −0.20 → +0.11 (negative then positive, rising; Δ +0.31 ± 0.01)" in head_mean
    assert "embed = unembed (tied): h1–h2 +0.50 → +0.50 (positive, flat; Δ +0.00 ± 0.00)" in head_mean
    assert "trunk_last: h1–h2 +0.40 → +0.40 (positive, flat" in head_mean
    assert "[all]" not in head_mean and "unembed:" not in head_mean and "leaf" not in head_mean
    sum_line = next(line for line in found if line.startswith("Gradient cosine between horizons, **reduction=sum**"))
    assert "trunk output: h1–h2 −0.31 → −0.31 (negative, flat; Δ +0.00 ± 0.00)" in sum_line
    compared = next(line for line in found if line.startswith("Gradient cosine by variant over the last third"))
    assert ("trunk output h1–h2: reduction=head_mean +0.11 ± 0.01, reduction=sum −0.31 ± 0.01 (differ by more than 2 se)"
            in compared)
    assert "embed = unembed (tied) h1–h2: reduction=head_mean +0.50 ± 0.00, reduction=sum +0.50 ± 0.00 (within 2 se: a tie)" in compared


def test_the_report_figure_puts_variants_side_by_side_groups_in_rows_tied_once_with_a_seed_band(records, tmp_path, monkeypatch):
    from lab.report import sweep_figures

    drawn = {}

    def capture(fig, path, format="png"):
        drawn["axes"] = [ax for ax in fig.axes if ax.get_visible()]
        return path

    monkeypatch.setattr(sweep_figures, "save_png", capture)
    assert sweep_figures.grad_cosine_heatmaps(variants(records), tmp_path / "grad_cosine.png") == tmp_path / "grad_cosine.png"
    titles = [ax.get_title() for ax in drawn["axes"]]
    assert titles == [f"reduction={r}\n{space}" for space in ("trunk output", "embed = unembed (tied)", "trunk_last")
                      for r in ("head_mean", "sum")]
    first = drawn["axes"][0]
    assert len(first.lines) == 2 and len(first.collections) == 1  # the pair's mean line, y = 0, and the ± sd band
    assert list(first.lines[0].get_ydata()) == pytest.approx([-0.2] * 3 + [0.0] * 3 + [0.11] * 3)


def test_the_paper_figure_has_the_same_layout_a_csv_with_the_seed_spread_and_the_findings_beside_it(tmp_path):
    from analysis.paper_figures import regenerate
    from tests.test_report_findings import sweep_of

    written = regenerate(sweep_of(tmp_path, ["ntp", "parallel"], seeds=2), tmp_path / "out", ["grad_cosine_over_training"])
    names = {p.name for p in written["grad_cosine_over_training"]}
    assert names == {f"grad_cosine_over_training.{ext}" for ext in ("png", "pdf", "svg", "csv", "md")}
    with (tmp_path / "out" / "grad_cosine_over_training.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {r["parameter group"] for r in rows} == {"trunk output"}  # the fixture logs grad/cos/leaf/…: the trunk output
    assert {r["seeds"] for r in rows} == {"2"} and {r["sd over seeds"] for r in rows} == {"0.0"}
    md = (tmp_path / "out" / "grad_cosine_over_training.md").read_text()
    assert md.startswith("- Gradient cosine between horizons, **parallel**") and "trunk output: h1–h2 +0.20 → +0.20" in md  # the paper shows readable labels (lab/report/labels.py)


@pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread
def test_a_real_diagnostics_run_with_tied_embeddings_shows_embed_and_unembed_once():
    from tests.test_diagnostics import build_module

    module = build_module(dict(name="parallel", k=3))
    callback = GradDiagnostics(every_n_steps=1)
    callback.setup(None, module, "fit")
    history: dict[str, list] = {}
    for step in range(3):
        for name, value in callback.measure(module, packed_batch(seed=step), step=step).metrics.items():
            history.setdefault(name, []).append((step, value))
    assert module.model.trunk.unembedding is module.model.trunk.embed.weight
    record = {**empty_record(), "status": "ok", "history": history}
    spaces = {s.space for s in conflict_series([record])}
    assert spaces == {"trunk output", "embed = unembed (tied)", "trunk_last"}
    series = next(s for s in conflict_series([record]) if s.space == "trunk output" and s.pair == (1, 2))
    assert list(series.mean) == pytest.approx([v for _, v in history["grad/cos/h1_h2"]])


@pytest.fixture(scope="module")
def composer():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        yield lambda job: compose("train", overrides=list(job))


def grid(key: str, values: list[str]) -> list[list[str]]:
    return [["head=parallel", "head.k=4", "data.seq_len=128", f"{key}={v}", f"seed={s}"] for v in values for s in (0, 1)]


def test_a_note_before_the_run_when_two_swept_reductions_differ_only_by_scale(composer):
    notes = equivalence_notes(grid("reduction", ["head_mean", "sum"]), composer)
    assert len(notes) == 1
    assert notes[0].startswith("sweep grid: reduction=head_mean and reduction=sum weigh the horizons alike up to a constant factor")
    # head_mean: c_k N_k = λ_k = 1 → 1/4 each; sum: c_k N_k = N_k = 16·(128 − k) → 127/502, 126/502, 125/502, 124/502
    assert "effective weights h1..h4 0.250/0.250/0.250/0.250 vs 0.253/0.251/0.249/0.247, within 1.2%" in notes[0]
    assert "AdamW cancels a constant factor" in notes[0]


def test_no_note_when_the_swept_weights_really_differ_or_there_is_one_horizon(composer):
    assert equivalence_notes(grid("weights", ["uniform", "geometric"]), composer) == []
    one_horizon = [["head=ntp", f"reduction={r}"] for r in ("head_mean", "sum")]
    assert equivalence_notes(one_horizon, composer) == []


def test_the_grid_sweeper_prints_the_note_before_the_first_job(composer, tmp_path, capsys):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweeper = GridSweeper.__new__(GridSweeper)  # Hydra's plugin scan may re-import BasicSweeper: skip its __init__
    sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    sweeper.hydra_context = type("Context", (), {"config_loader": type("Loader", (), {
        "load_sweep_config": staticmethod(lambda config, job: composer(job))})()})()
    overrides = OverridesParser.create().parse_overrides(["head=parallel", "head.k=4", "reduction=sum,global"])
    sweeper.split_arguments(overrides, None)
    err = capsys.readouterr().err
    assert "sweep grid: reduction=sum and reduction=global weigh the horizons alike up to a constant factor (identical " in err, err

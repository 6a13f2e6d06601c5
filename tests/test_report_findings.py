"""Findings a reader cannot falsify from runs.csv: constructed sweeps for each way the report misled before.

Each sweep is written as `lab-train -m` leaves it (tests/test_report.py `fake_job`), then edited to the case:
no ntp job, a non-monotone horizon loss, agreement that is degenerate, a model above the unigram entropy,
collapsed heads, one seed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.report.build import build_sweep_report
from lab.report.plotting import also_save_as
from lab.report.records import ReportError, collect_sweep
from lab.report.render import variant_table
from lab.report.sweep_figures import loss_vs_speedup
from lab.report.table import variants
from tests.cli import lab_report, one_error_line
from tests.test_report import fake_job


def sweep_of(tmp_path: Path, heads: list[str], seeds: int = 2) -> Path:
    sweep = tmp_path / "sweep"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    for job, (head, seed) in enumerate((h, s) for h in heads for s in range(seeds)):
        fake_job(sweep, job, head, seed)
    return sweep


def edit_runs(sweep: Path, edit) -> None:
    """edit(payload) on every job's run.json."""
    for run_json in sweep.glob("*/run.json"):
        payload = json.loads(run_json.read_text())
        edit(payload)
        run_json.write_text(json.dumps(payload))


def findings_of(sweep: Path, baseline: str | None = None) -> list[str]:
    return build_sweep_report(sweep, baseline).findings


def test_a_sweep_without_ntp_states_no_difference_to_ntp_until_a_baseline_is_chosen(tmp_path):
    sweep = sweep_of(tmp_path, ["parallel", "deepseek"])
    found = findings_of(sweep)
    assert sum(line.startswith("No single baseline variant") for line in found) == 1
    assert not any("Difference to" in line or "ntp" in line for line in found if not line.startswith("No single baseline")), found
    chosen = findings_of(sweep, baseline="head=parallel")
    assert "Difference to the baseline head=parallel (3.1050): head=deepseek +0.1000 (negative = better than head=parallel; a tie: inside the noise floor)." in chosen


def test_an_unknown_baseline_is_one_line_exit_2_and_writes_nothing(tmp_path):
    sweep = sweep_of(tmp_path, ["parallel", "deepseek"])
    before = sorted(p.name for p in sweep.iterdir())
    with pytest.raises(ReportError, match="report.baseline: 'head=ntp' is not a variant of this sweep; allowed: head=parallel, head=deepseek"):
        build_sweep_report(sweep, "head=ntp")
    out = lab_report(str(sweep), "--baseline", "head=ntp")
    assert out.returncode == 2 and "report.baseline" in one_error_line(out)
    assert sorted(p.name for p in sweep.iterdir()) == before  # no runs.csv, report or figures


def test_the_horizon_trend_states_both_tests_and_shows_every_horizon(tmp_path):
    sweep = sweep_of(tmp_path, ["ntp", "parallel"])
    bumpy = {"val/loss/h1": 3.0, "val/loss/h2": 3.2, "val/loss/h3": 3.1, "val/loss/h4": 3.4}  # endpoints rise, not every step
    edit_runs(sweep, lambda p: p["final_metrics"].update(bumpy) if p["manifest"]["head"] == "parallel" else None)
    line = next(line for line in findings_of(sweep) if line.startswith("Per-horizon validation loss"))
    assert "Endpoint test (hK > h1): rises in 1 of 1" in line
    assert "strict test (every h(k+1) > hk): in 0 of 1" in line
    assert "head=parallel: 3.000 → 3.200 → 3.100 → 3.400" in line


def set_corpus(sweep: Path, **stats) -> None:
    edit_runs(sweep, lambda p: p.update(corpus_stats=stats))


def test_a_degenerate_agreement_is_flagged_beside_its_estimate(tmp_path):
    sweep = sweep_of(tmp_path, ["ntp", "parallel"])
    set_corpus(sweep, unigram_nats_per_token=4.0, top_token_share=0.12)
    degenerate = {"val/agree/h2": 0.9995, "val/acc/h1": 0.125, "val/est_tokens_per_forward": 3.92}
    edit_runs(sweep, lambda p: p["final_metrics"].update(degenerate) if p["manifest"]["head"] == "parallel" else None)
    warnings = [line for line in findings_of(sweep) if line.startswith("**Warning:**")]
    assert warnings == [
        "**Warning:** head=parallel's horizon-2 agreement is 0.9995 (≥ 0.95) with top-1 accuracy 0.125 against the most frequent "
        "token's share 0.120: its heads agree because they predict the same frequent token, so its est tokens/forward "
        "(3.92 ± 0.00) is not a decoding speed."]
    set_corpus(sweep, unigram_nats_per_token=4.0, top_token_share=0.02)  # accuracy far above the frequent token: no warning
    assert not any(line.startswith("**Warning:**") for line in findings_of(sweep))


def test_every_model_above_the_unigram_entropy_is_flagged(tmp_path):
    """Runs recorded before the validation statistic: the training entropy, named as such."""
    sweep = sweep_of(tmp_path, ["ntp", "parallel"])
    set_corpus(sweep, unigram_nats_per_token=3.05, top_token_share=0.01)  # ntp 3.005 is below it, parallel 3.105 above
    warnings = [line for line in findings_of(sweep) if "unigram entropy" in line]
    assert len(warnings) == 1 and "1 of 2 variants" in warnings[0] and "head=parallel 3.105" in warnings[0]
    assert "the training tokens' unigram entropy (these runs recorded no validation cross-entropy under it)" in warnings[0]
    set_corpus(sweep, unigram_nats_per_token=3.5, top_token_share=0.01)
    assert not any("unigram entropy" in line for line in findings_of(sweep))
    set_corpus(sweep, unigram_nats_per_token=2.5, top_token_share=0.01)
    assert any(line.startswith("**Warning:** Every variant still has") for line in findings_of(sweep))


def test_the_unigram_floor_is_the_validation_tokens_cost_under_the_training_unigram(tmp_path):
    """The false alarm: validation text unlike training (a hash split that sent 2 files of regexes to validation) costs
    3.947 nats under the training unigram; every variant beats that, though none beats the training entropy 3.304."""
    sweep = sweep_of(tmp_path, ["ntp", "parallel"])
    set_corpus(sweep, unigram_nats_per_token=2.5, val_unigram_cross_entropy_nats=3.947, top_token_share=0.01)
    assert not any("unigram" in line for line in findings_of(sweep))
    set_corpus(sweep, unigram_nats_per_token=3.9, val_unigram_cross_entropy_nats=3.05, top_token_share=0.01)
    (warning,) = [line for line in findings_of(sweep) if "unigram" in line]
    assert "1 of 2 variants" in warning and "the validation tokens' cross-entropy under the training tokens' unigram (3.050" in warning


def test_a_small_validation_split_is_flagged_with_the_setting_that_fixes_it(tmp_path):
    sweep = sweep_of(tmp_path, ["ntp", "parallel"])
    set_corpus(sweep, n_docs_val=2, n_bytes_val=13_000, top_token_share=0.01)
    (warning,) = [line for line in findings_of(sweep) if "validation holds" in line]
    assert warning.startswith("**Warning:** validation holds 2 documents (13.0 KB;") and "`data.val_fraction`" in warning
    set_corpus(sweep, n_docs_val=27, n_bytes_val=343_739, top_token_share=0.01)  # the main job's split
    assert not any("validation holds" in line for line in findings_of(sweep))


def collapse(sweep: Path, shares: dict[int, float], tops: dict[int, float]) -> None:
    metrics = {**{f"val/top_token_share/h{k}": x for k, x in shares.items()}, **{f"val/top_token/h{k}": x for k, x in tops.items()}}
    edit_runs(sweep, lambda p: p["final_metrics"].update(metrics) if p["manifest"]["head"] == "parallel" else None)


def test_heads_that_all_predict_one_token_are_flagged(tmp_path):
    sweep = sweep_of(tmp_path, ["ntp", "parallel"])
    collapse(sweep, {k: 0.9 for k in range(1, 5)}, {k: 32.0 for k in range(1, 5)})
    (warning,) = [line for line in findings_of(sweep) if line.startswith("**Warning:**") and "one id in most rows" in line]
    assert warning.startswith("**Warning:** head=parallel: 4 of 4 horizons each predict one id in most rows: h1 (id 32, 90% of "
                              "its rows), h2 (id 32, 90% of its rows)")
    assert "shares h1..h4: 0.90, 0.90, 0.90, 0.90" in warning


def test_one_collapsed_horizon_is_named_with_the_speedup_it_inflates(tmp_path):
    """Parallel K=4 with h4 on a space in 97 % of its rows: 3.01 tokens/forward and a 1.51× speedup that mean nothing."""
    sweep = sweep_of(tmp_path, ["ntp", "parallel"])
    collapse(sweep, {1: 0.30, 2: 0.35, 3: 0.40, 4: 0.97}, {1: 10.0, 2: 11.0, 3: 12.0, 4: 32.0})
    edit_runs(sweep, lambda p: p["final_metrics"].update({"decode/tokens_per_forward": 3.01, "decode/speedup": 1.51})
              if p["manifest"]["head"] == "parallel" else None)
    (warning,) = [line for line in findings_of(sweep) if line.startswith("**Warning:**") and "one id in most rows" in line]
    assert warning.startswith("**Warning:** head=parallel: 1 of 4 horizons predicts one id in most rows: h4 (id 32, 97% of its rows)")
    assert "tokens/forward 3.01 ± 0.00; speedup 1.51 ± 0.00" in warning
    collapse(sweep, {4: 0.45}, {})
    assert not any("one id in most rows" in line for line in findings_of(sweep))


def test_one_seed_makes_no_significance_claim_and_says_so(tmp_path):
    sweep = sweep_of(tmp_path, ["ntp", "parallel"], seeds=1)
    found = findings_of(sweep)
    assert not any("Welch" in line for line in found)
    assert any(line.startswith("**Warning:** no significance is claimed for head=ntp n = 1, head=parallel n = 1") for line in found)
    assert not any("no significance" in line for line in findings_of(sweep_of(tmp_path / "two", ["ntp", "parallel"], seeds=2)))


def set_losses(sweep: Path, losses: dict[tuple[str, int], float]) -> None:
    """Each job's final val/loss from {(head, seed): loss}."""
    for run_json in sweep.glob("*/run.json"):
        payload = json.loads(run_json.read_text())
        head = payload["manifest"]["head"]
        payload["final_metrics"]["val/loss"] = losses[(head, payload["config"]["seed"])]
        run_json.write_text(json.dumps(payload))


def test_a_gap_inside_the_seed_noise_floor_is_reported_as_a_tie(tmp_path):
    sweep = sweep_of(tmp_path, ["ntp", "parallel"])
    set_losses(sweep, {("ntp", 0): 3.00, ("ntp", 1): 3.02, ("parallel", 0): 3.01, ("parallel", 1): 3.03})
    found = findings_of(sweep)
    # each variant's seed sd: |0.02|/√2 = 0.014142; pooled the same; floor 2·0.014142·√(1/2 + 1/2) = 0.028284
    assert any(line.startswith("Noise floor: the seed sd of validation loss, pooled over variants with ≥ 2 seeds, is 0.0141 nats")
               for line in found), found
    assert any("ahead of head=parallel by 0.0100 nats (inside the noise floor 0.0283: a tie)" in line for line in found), found
    assert any("head=parallel +0.0100 (a tie)" in line for line in found), found


def test_a_gap_beyond_the_seed_noise_floor_clears_it(tmp_path):
    sweep = sweep_of(tmp_path, ["ntp", "parallel"])
    set_losses(sweep, {("ntp", 0): 3.00, ("ntp", 1): 3.02, ("parallel", 0): 3.05, ("parallel", 1): 3.07})
    found = findings_of(sweep)
    assert any("ahead of head=parallel by 0.0500 nats (clears the noise floor 0.0283)" in line for line in found), found
    assert any("head=parallel +0.0500 (negative = better" in line for line in found), found
    assert not any("(a tie)" in line for line in found), found


def test_with_one_seed_the_floor_is_the_recorded_cross_machine_spread(tmp_path):
    from lab.report.noise import ONE_SEED_SPREAD

    sweep = sweep_of(tmp_path, ["ntp", "parallel", "deepseek"], seeds=1)
    assert 0.01 < ONE_SEED_SPREAD < 0.1
    set_losses(sweep, {("ntp", 0): 3.00, ("parallel", 0): 3.01, ("deepseek", 0): 3.10})
    found = findings_of(sweep)
    assert any(line.startswith("Noise floor: one seed per variant") and f"{ONE_SEED_SPREAD:.4f} nats" in line for line in found), found
    (difference,) = [line for line in found if line.startswith("Difference to the baseline")]
    assert "head=parallel +0.0100 (a tie)" in difference and "head=deepseek +0.1000 (negative" in difference


def test_jobs_computed_under_different_numerics_are_named(tmp_path):
    sweep = sweep_of(tmp_path, ["ntp", "parallel"], seeds=1)
    fingerprint = {"cpu": "AMD EPYC", "isa": ["avx2"], "capability": "AVX512", "env": {}, "torch": "2.13.0", "mkl": "2024.2",
                   "onednn": "3.12.0", "threads": 1, "dtype": "float32", "precision": "32-true"}
    for run_json in sweep.glob("*/run.json"):
        payload = json.loads(run_json.read_text())
        payload["numerics"] = {**fingerprint, "threads": 2} if payload["manifest"]["head"] == "parallel" else fingerprint
        run_json.write_text(json.dumps(payload))
    (note,) = [line for line in findings_of(sweep) if line.startswith("The jobs of these tables computed under different numerics")]
    assert "(threads differ)" in note and "1 thread ·" in note and "2 threads ·" in note
    edit_runs(sweep, lambda payload: payload.update(numerics=fingerprint))
    assert not any("different numerics" in line for line in findings_of(sweep))


def test_the_fastest_decoder_headline_names_its_collapsed_horizons(tmp_path):
    sweep = sweep_of(tmp_path, ["ntp", "parallel", "deepseek"])
    edit_runs(sweep, lambda p: p["final_metrics"].update({"decode/speedup": 1.51 if p["manifest"]["head"] == "parallel" else 1.1})
              if p["manifest"]["head"] != "ntp" else None)
    collapse(sweep, {1: 0.30, 2: 0.35, 3: 0.40, 4: 0.97}, {4: 32.0})
    (headline,) = [line for line in findings_of(sweep) if line.startswith("Fastest speculative decoding")]
    assert "**head=parallel**" in headline and "but its horizon h4 predict one id in most rows" in headline
    collapse(sweep, {4: 0.30}, {})
    (headline,) = [line for line in findings_of(sweep) if line.startswith("Fastest speculative decoding")]
    assert "predict one id" not in headline


def test_a_one_id_horizons_numbers_are_marked_in_the_table_and_on_the_speedup_plot(tmp_path):
    """Issue 69: a degenerate horizon's loss and accuracy sat unmarked in the table, its speedup unmarked on the plot."""
    sweep = sweep_of(tmp_path, ["ntp", "parallel"])
    edit_runs(sweep, lambda p: p["final_metrics"].update({"decode/speedup": 1.51}) if p["manifest"]["head"] == "parallel" else None)
    collapse(sweep, {1: 0.30, 2: 0.35, 3: 0.40, 4: 0.97}, {4: 32.0})
    groups = variants(collect_sweep(sweep).records, None)
    header, rows = variant_table(groups)
    parallel = next(row for row in rows if row[0] == "head=parallel")
    marked = {name for name, cell in zip(header, parallel) if cell.endswith(" 1-id")}
    assert marked == {"val/loss/h4", "val/acc/h4", "est tokens/forward (val)"}, marked
    assert not any(str(cell).endswith(" 1-id") for row in rows if row[0] != "head=parallel" for cell in row)
    with also_save_as("svg"):
        loss_vs_speedup(groups, tmp_path / "loss_vs_speedup.png")
    svg = (tmp_path / "loss_vs_speedup.svg").read_text()
    assert "(h4 1-id)" in svg and svg.count("1-id") == 1  # the point's label, and no other

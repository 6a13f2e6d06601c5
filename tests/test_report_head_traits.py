"""The report reads a run's head traits and K from its record (run.json / the wandb run config), not from the model."""

import dataclasses
import json
from pathlib import Path

import pytest

from lab.model.heads import HEAD_SPECS, report_traits
from lab.report.head_traits import TRAITS_BEFORE_RECORDING, UNKNOWN, traits_of
from lab.report.records import Sweep, collect_sweep, record_from_wandb
from lab.report.render import findings
from lab.report.table import variants
from tests.test_report import fake_job, final_value, wandb_run

RECORDED = {  # perturbed on purpose: parallel is recorded as the baseline and listed first, ntp is not
    "ntp": {"baseline": False, "teacher_forced": False, "display_rank": 1},
    "parallel": {"baseline": True, "teacher_forced": False, "display_rank": 0},
}


def two_head_sweep(root: Path, traits: dict | None) -> tuple[Sweep, list]:
    """ntp and parallel, two seeds each; `traits` (head → run.json `head_traits`) or None for records from before them."""
    root.mkdir()
    (root / "multirun.yaml").write_text("hydra: {}\n")
    for job, (head, seed) in enumerate((h, s) for h in ("ntp", "parallel") for s in range(2)):
        run_json = fake_job(root, job, head, seed) / "run.json"
        if traits is not None:
            run_json.write_text(json.dumps({**json.loads(run_json.read_text()), "head_traits": traits[head]}))
    sweep = collect_sweep(root)
    return sweep, variants(sweep.records)


def loss_of(head: str) -> float:
    """fake_job's val/loss for seeds 0 and 1 (tests/test_report.py), averaged."""
    base = 3.0 + 0.1 * ["ntp", "parallel", "deepseek"].index(head)
    return (final_value("val/loss", base) + final_value("val/loss", base + 0.01)) / 2


def test_a_recorded_baseline_is_the_baseline_whatever_its_name(tmp_path):
    sweep, recorded = two_head_sweep(tmp_path / "recorded", RECORDED)
    assert [v.label for v in recorded if v.is_baseline] == ["head=parallel"]
    difference = next(line for line in findings(sweep, recorded) if line.startswith("Difference to the baseline"))
    assert difference.startswith(f"Difference to the baseline head=parallel ({loss_of('parallel'):.4f}): head=ntp {loss_of('ntp') - loss_of('parallel'):+.4f}")
    # The same runs recorded before head_traits existed: read by head name, ntp is the baseline.
    sweep, legacy = two_head_sweep(tmp_path / "legacy", None)
    assert [v.label for v in legacy if v.is_baseline] == ["head=ntp"]
    difference = next(line for line in findings(sweep, legacy) if line.startswith("Difference to the baseline"))
    assert difference.startswith(f"Difference to the baseline head=ntp ({loss_of('ntp'):.4f}): head=parallel {loss_of('parallel') - loss_of('ntp'):+.4f}")


def test_the_recorded_display_rank_orders_tables_and_figures(tmp_path):
    from lab.report.sweep_figures import order_key

    recorded = sorted(two_head_sweep(tmp_path / "recorded", RECORDED)[1], key=order_key)
    assert [v.label for v in recorded] == ["head=parallel", "head=ntp"]
    legacy = sorted(two_head_sweep(tmp_path / "legacy", None)[1], key=order_key)
    assert [v.label for v in legacy] == ["head=ntp", "head=parallel"]


def test_a_wandb_run_config_carries_the_traits_and_k():
    run = wandb_run("deepseek", 0)  # config head: depth 3, k null
    legacy = record_from_wandb(run, 0)
    assert legacy["k"] == 4 and traits_of(legacy).teacher_forced and not traits_of(legacy).baseline
    logged = {"baseline": True, "teacher_forced": False, "display_rank": 0}
    recorded = record_from_wandb({**run, "config": {**run["config"], "k": 7, "head_traits": logged}}, 0)
    assert recorded["k"] == 7  # the recorded K, not depth + 1
    assert dataclasses.asdict(traits_of(recorded)) == logged


@pytest.mark.parametrize("payload, k", [
    ({"k": 5, "config": {"head": {"name": "deepseek", "depth": 2, "k": None}}}, 5),  # the recorded K wins
    ({"manifest": {"head": "deepseek", "k": 3}, "config": {"head": {"name": "deepseek", "depth": 2}}}, 3),  # before `k`: the manifest's
    ({"config": {"head": {"name": "deepseek", "depth": 2, "k": None}}}, 3),  # a refused old run: only the depth
    ({"config": {"head": {"name": "parallel", "k": 4}}}, 4),
], ids=["recorded", "manifest", "depth_only", "config"])
def test_k_is_read_from_the_record_and_old_records_keep_reading(tmp_path, payload, k):
    sweep = tmp_path / "sweep"
    job = sweep / "0-job"
    job.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    (job / "run.json").write_text(json.dumps({"status": "failed", "error": "refused", **payload}))
    (record,) = collect_sweep(sweep).records
    assert record["k"] == k


def test_the_traits_of_older_records_are_those_the_registry_gave_those_heads():
    """TRAITS_BEFORE_RECORDING is history; it must still agree with the registry on every head it lists."""
    for name, traits in TRAITS_BEFORE_RECORDING.items():
        assert name in HEAD_SPECS
        current = report_traits(name)
        assert (traits.baseline, traits.teacher_forced) == (current["baseline"], current["teacher_forced"]), name
    listed = list(TRAITS_BEFORE_RECORDING)
    assert sorted(listed, key=lambda n: TRAITS_BEFORE_RECORDING[n].display_rank) == sorted(listed, key=lambda n: report_traits(n)["display_rank"])
    assert traits_of({"head": "no-such-head"}) == UNKNOWN and UNKNOWN.display_rank > max(t.display_rank for t in TRAITS_BEFORE_RECORDING.values())

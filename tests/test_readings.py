"""Row readings (lab/objective/readings.py): truncation at the first miss (objective.truncate=first_miss) and
training-time acceptance (lab/callbacks/acceptance.py).

Oracles: a hand grid of hits gives the kept masks; hits and top-1 ids from the validation statistics
(lab/objective/backward.py, another implementation) give the truncated masks of a real model, and the
truncated loss is the schedule's loss on those masks; a head that copies the path is accepted with
α = 1; Σ α equals rows − the tv loss on the same rows; τ by hand.
"""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch

from lab.callbacks.acceptance import acceptance_metrics
from lab.objective import build_backward_schedule, evaluate_horizons
from lab.objective.objective import Objective
from lab.objective.readings import first_miss_masks, read_horizons
from lab.objective.targets import TargetConfig, attach_teachers
from tests.cli import TINY, lab_train, lab_train_in_process
from tests.helpers import build_model, packed_batch
from tests.test_targets import copying_horizons

pytestmark = pytest.mark.usefixtures("single_thread")


def bools(rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_first_miss_keeps_a_row_only_while_every_earlier_horizon_hit():
    horizons = [SimpleNamespace(mask=bools([[1, 1, 1, 1, 1]])), SimpleNamespace(mask=bools([[1, 1, 1, 0]])), SimpleNamespace(mask=bools([[1, 1, 1]]))]
    hits = [bools([[1, 0, 1, 1, 1]]), bools([[1, 1, 0, 0]]), bools([[0, 0, 0]])]
    masks = first_miss_masks(horizons, hits)
    assert [m.tolist() for m in masks] == [[[True] * 5], [[True, False, True, False]], [[True, False, False]]]


def objective(target="data", truncate="first_miss", k=3):
    return Objective.build({"policy": "head_mean"}, {"name": "uniform"}, {"name": "sequential"}, k=k,
                           objective={"target": target, "truncate": truncate})


@pytest.mark.parametrize("target", ["data", "distill"])
def test_truncation_of_a_real_model_follows_its_own_hits_and_the_loss_follows_the_masks(target):
    model = build_model("parallel", 3, seed=3)
    batch = packed_batch(seed=1)
    chosen = objective(target)
    horizons = chosen.training_targets(model(batch))
    stats = evaluate_horizons(model(batch))  # the validation path's hits and top-1 ids (no teachers)
    if target == "data":
        hit1, hit2 = stats.row_correct[0], stats.row_correct[1]  # [B, S-1], [B, S-2]
    else:  # horizon 2's own target is the teacher's top-1: the next-token path's top-1 one row later
        hit1 = stats.row_correct[0]
        hit2 = (stats.row_argmax[1] == stats.row_argmax[0][:, 1:]) & (stats.row_argmax[1] >= 0)
    truncated = chosen.truncated(horizons, chosen.readings(horizons, with_acceptance=False))
    expected2 = horizons[1].mask & hit1[:, : hit2.shape[1]]
    expected3 = horizons[2].mask & hit1[:, : horizons[2].mask.shape[1]] & hit2[:, : horizons[2].mask.shape[1]]
    assert torch.equal(truncated[0].mask, horizons[0].mask)
    assert torch.equal(truncated[1].mask, expected2) and torch.equal(truncated[2].mask, expected3)
    assert 0 < expected2.sum() < horizons[1].mask.sum()  # the oracle is not trivial: some rows kept, some dropped
    by_hand = [horizons[0], dataclasses.replace(horizons[1], mask=expected2), dataclasses.replace(horizons[2], mask=expected3)]
    with torch.no_grad():
        _, ours = build_backward_schedule("sequential").run(truncated, torch.ones(3))
        _, reference = build_backward_schedule("sequential").run(by_hand, torch.ones(3))
    torch.testing.assert_close(ours.loss_sums, reference.loss_sums)
    assert ours.counts.tolist() == [horizons[0].mask.sum().item(), expected2.sum().item(), expected3.sum().item()]


def test_a_head_that_copies_the_path_is_always_accepted():
    model = build_model("identity", 1)
    readings = read_horizons(copying_horizons(model, packed_batch()), with_acceptance=True)
    sums = readings.sums()  # [2, 3]: (Σ α, Σ agreement, rows)
    assert sums[1, 2] > 0
    torch.testing.assert_close(sums[1, 0], sums[1, 2], rtol=1e-6, atol=1e-4)  # α = 1 on every row
    assert sums[1, 1] == sums[1, 2]  # and the same top-1


def test_expected_acceptance_is_rows_minus_the_tv_loss_on_the_same_rows():
    model = build_model("parallel", 3, seed=2)
    horizons = attach_teachers(model(packed_batch()), TargetConfig("tv"))
    readings = read_horizons(horizons, with_acceptance=True)
    with torch.no_grad():
        _, stats = build_backward_schedule("joint").run(horizons, torch.ones(3))
    sums = readings.sums()
    for k in (1, 2):  # horizons 2 and 3: tv's rows are the compared rows
        assert sums[k, 2] == stats.counts[k]
        torch.testing.assert_close(sums[k, 0], stats.counts[k].double() - stats.loss_sums[k].double(), rtol=1e-5, atol=1e-5)


def test_tau_is_one_plus_the_running_products_of_mean_acceptance():
    sums = torch.tensor([[4.0, 4.0, 4.0], [2.0, 1.0, 4.0], [1.0, 0.0, 4.0]], dtype=torch.float64)
    metrics = acceptance_metrics(sums, "train", contiguous=True, with_agreement=True)
    assert metrics["train/accept/h2"] == 0.5 and metrics["train/accept/h3"] == 0.25 and metrics["train/agree/h2"] == 0.25
    assert metrics["train/tau"] == pytest.approx(1 + 0.5 + 0.5 * 0.25)
    assert "val/tau" not in acceptance_metrics(sums, "val", contiguous=False, with_agreement=False)  # a leap: no chain


def test_a_run_logs_acceptance_and_the_kept_share_and_records_them(tmp_path, cache_dir):
    run = tmp_path / "run"
    result = lab_train_in_process(*TINY, "head=parallel", "head.k=3", "objective.target=lk", "objective.truncate=first_miss",
                                  "callbacks.decoding=null", f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    final = json.loads((run / "run.json").read_text())["final_metrics"]
    for name in ("train/accept/h2", "train/accept/h3", "train/agree/h2", "train/kept/h2", "train/kept/h3", "val/accept/h3"):
        assert 0.0 <= final[name] <= 1.0, name
    assert 1.0 <= final["val/tau"] <= 3.0 and final["val/tau"] == pytest.approx(1 + final["val/accept/h2"] * (1 + final["val/accept/h3"]), rel=1e-5)


@pytest.mark.parametrize("overrides, message", [
    (["head=ntp", "objective.truncate=first_miss"], "objective.truncate: it shapes horizons 2..K and head.k=1 has none (it would change nothing)"),
    (["objective.truncate=always"], "objective.truncate: unknown 'always'; allowed: none, first_miss"),
    (["head=parallel", "head.k=2", "objective.target=tv", "schedule=chunked"], "objective.target: 'tv' needs the logits"),
])
def test_bad_truncation_or_target_is_one_line_before_the_run_folder(tmp_path, cache_dir, overrides, message):
    result = lab_train(*TINY, *overrides, f"hydra.run.dir={tmp_path / 'run'}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "run").exists()

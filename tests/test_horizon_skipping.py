"""Skipped horizons (weights=phased): a horizon whose λ is 0 for the rest of training is not computed.

Oracles: a step that skips horizons gives the same loss, counts and gradients as the same step
with those λ set to 0 and every horizon computed (every head, joint and sequential backward,
a policy whose coefficients depend on the skipped counts); PyTorch's FLOP counter sees fewer
FLOPs; through a real Trainer the logged λ and `train/active_horizons` follow the phases, the
per-horizon tensors stay [K], and a run resumed across a phase boundary equals an uninterrupted one.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lab.callbacks.horizon_metrics import HorizonMetrics
from lab.objective import Progress
from lab.objective.objective import Objective
from lab.training.step import train_step
from tests.head_cases import case, without
from tests.helpers import build_model, packed_batch

pytestmark = pytest.mark.usefixtures("single_thread")

PHASES = [[1, 0.5, [0.25, 0]], [1, [0.5, 0]], [1]]
TOTAL = 12  # phase 1: steps 0-3 (3 horizons), phase 2: 4-7 (2), phase 3: 8-11 (1)
HEADS = {  # every registered head with more than one horizon, and a variant
    **without("ntp"),
    "anticausal": case("anticausal", layers=4),
    "parallel_leaps": case("parallel", offsets=[1, 2, 4]),
    "parallel_draft_vocab": case("parallel", draft_vocab=12),  # skipped horizons count only targets in the set
}


def model_of(head: str):
    model = build_model(**HEADS[head])
    if model.draft_ids is not None:
        model.set_draft_ids(torch.arange(0, 2 * model.draft_ids.numel(), 2))  # the even ids
    return model


class CapturedGradients:
    """An Optimization that backpropagates and keeps the gradients instead of stepping."""

    def __init__(self, model):
        self.model, self.grads = model, {}

    def zero_grad(self):
        self.model.zero_grad(set_to_none=True)

    def backward(self, root):
        root.backward()

    def update(self):
        self.grads = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in self.model.named_parameters()}


def objective(weights: dict, schedule: str, policy: str = "global", target: str = "data") -> Objective:
    return Objective.build({"policy": policy}, weights, {"name": schedule}, k=3, objective={"target": target})


def step(model, obj, step_index: int):
    optimization = CapturedGradients(model)
    out = train_step(model, obj, packed_batch(), Progress(step_index, 0, TOTAL), optimization)
    return out, optimization.grads


@pytest.mark.parametrize("schedule", ["joint", "sequential"])
@pytest.mark.parametrize("head", list(HEADS))
@pytest.mark.parametrize("step_index, live", [(5, 2), (9, 1)])
def test_skipped_horizons_equal_lambda_zero(head, schedule, step_index, live):
    check_skipped_equals_lambda_zero(head, schedule, step_index, live, "data")


@pytest.mark.parametrize("head", ["parallel", "deepseek", "parallel_leaps", "parallel_draft_vocab"])
def test_skipped_horizons_equal_lambda_zero_under_distillation(head):
    """A distilled horizon's rows also need a teacher row: skipped counts follow the same rule."""
    check_skipped_equals_lambda_zero(head, "sequential", 5, 2, "distill")


def check_skipped_equals_lambda_zero(head, schedule, step_index, live, target):
    phased = objective({"name": "phased", "phases": PHASES}, schedule, target=target)
    progress = Progress(step_index, 0, TOTAL)
    assert phased.live_horizons(progress) == live
    lambdas = phased.weight_schedule.lambdas(progress).tolist()
    assert lambdas[live:] == [0.0] * (3 - live)
    zero = objective({"name": "uniform", "lambdas": lambdas}, schedule, target=target)  # same λ, every horizon computed
    skipped, g_skipped = step(model_of(head), phased, step_index)
    full, g_full = step(model_of(head), zero, step_index)
    assert skipped.active_horizons == live and full.active_horizons == 3
    torch.testing.assert_close(skipped.loss, full.loss, rtol=1e-6, atol=0)
    assert torch.equal(skipped.counts, full.counts) and skipped.counts.shape == (3,)  # skipped counts from the labels
    torch.testing.assert_close(skipped.coefficients, full.coefficients, rtol=0, atol=0)  # from the counts and λ alone: the same arithmetic
    torch.testing.assert_close(skipped.loss_sums[:live], full.loss_sums[:live], rtol=1e-6, atol=0)
    assert skipped.loss_sums.shape == skipped.local_counts.shape == skipped.correct.shape == (3,)
    for name, grad in g_full.items():
        torch.testing.assert_close(g_skipped[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def step_flops(model, obj, step_index: int) -> int:
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        step(model, obj, step_index)
    return counter.get_total_flops()


@pytest.mark.parametrize("head", ["parallel", "identity", "deepseek"])
def test_skipping_saves_step_flops(head):
    phased = objective({"name": "phased", "phases": PHASES}, "sequential")
    zero = objective({"name": "uniform", "lambdas": [1.0, 0.0, 0.0]}, "sequential")  # phase 3's λ, nothing skipped
    model = build_model(**HEADS[head])
    flops = {s: step_flops(model, phased, s) for s in (0, 5, 9)}  # 3, 2, 1 horizons
    full = step_flops(model, zero, 9)
    assert flops[0] == full  # nothing skipped yet: same work as the λ = 0 run
    assert flops[9] < flops[5] < flops[0]
    cfg = model.model_cfg
    valid = [int(h.mask.sum()) for h in model(packed_batch())[1:]]  # the backward schedules project valid rows only
    projections = 3 * sum(2 * n * cfg.d_model * cfg.vocab_size for n in valid)  # forward + backward of horizons 2, 3
    if head == "identity":
        assert flops[0] - flops[9] == projections  # exactly the two skipped projections: the heads have nothing else
    else:
        assert flops[0] - flops[9] > projections  # their blocks (depth modules) are skipped too
        assert flops[0] - flops[9] > 0.3 * flops[0]


def test_phased_run_logs_lambda_and_active_horizons_and_resumes_across_a_phase(tiny_cfg, tmp_path):
    from tests.fit_helpers import fit

    class Record(__import__("pytorch_lightning").Callback):
        def __init__(self):
            self.steps = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            out = outputs["step"]
            self.steps.append((out.active_horizons, out.lambdas.tolist(), tuple(out.loss_sums.shape)))

    overrides = ("head=identity", "head.k=3", "weights=phased", "trainer.max_steps=6")
    record = Record()
    trainer, whole, _ = fit(tiny_cfg(*overrides), tmp_path / "whole", max_steps=6, callbacks=[record, HorizonMetrics()])
    logged = {name: value.item() for name, value in trainer.callback_metrics.items()}  # the last step's, as run.json records
    assert logged["train/active_horizons"] == 1 and logged["train/lambda/h3"] == 0
    assert math.isnan(logged["train/loss/h3"]) and math.isnan(logged["train/loss/h2"])  # skipped: not computed
    assert math.isfinite(logged["train/loss/h1"]) and logged["train/count/h3"] > 0
    assert [s[0] for s in record.steps] == [3, 3, 2, 2, 1, 1]
    assert [s[1] for s in record.steps] == [[1, 0.5, 0.25], [1, 0.5, 0.125], [1, 0.5, 0], [1, 0.25, 0], [1, 0, 0], [1, 0, 0]]
    assert {s[2] for s in record.steps} == {(3,)}
    fit(tiny_cfg(*overrides), tmp_path / "split", max_steps=3, every=3)
    _, resumed, _ = fit(tiny_cfg(*overrides), tmp_path / "split", max_steps=6, every=3,
                        ckpt_path=str(tmp_path / "split" / "checkpoints" / "last.ckpt"))
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)

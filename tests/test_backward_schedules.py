"""Backward schedules (docs/architecture.md, the training step): joint, sequential and chunked give the same loss and gradients.

Reference: full logits of every horizon (helpers.horizon_sums), loss Σ_k c_k S_k, one backward.
Every schedule's loss and every parameter gradient must match it, for every head, every
reduction policy, both trunk-gradient modes, a padded two-document batch, and a batch whose
horizon 4 is empty.
"""

import pytest
import torch

from lab.errors import ConfigError
from lab.objective import POLICIES, build_backward_schedule, coefficients, evaluate_horizons
from tests.head_cases import case, without
from tests.helpers import build_model, grads, horizon_sums, packed_batch, short_docs_batch

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread

HEADS = {  # every registered head at K = 4 (deepseek by depth), and variants
    **without("deepseek", k=4),
    "anticausal": case("anticausal", 4, compute_match="none"),
    "linear_replicated": case("linear", 4, unembedding="replicated"),
    "deepseek_d3": case("deepseek", 4),
    "deepseek_d2": case("deepseek"),
}
SCHEDULES = ("joint", "sequential", "chunked")
CHUNK_ROWS = 4
LAMBDAS = (1.0, 0.5, 0.25, 0.125)
BATCHES = {"packed": packed_batch, "short_docs": short_docs_batch}


def close(a, b, rtol=1e-5):
    return (a - b).abs().max().item() <= rtol * a.abs().max().item() + 1e-8


def run_schedule(model, batch, policy, schedule):
    """(loss Σ c_k S_k, grads, stats) through one schedule; the reference when schedule is None."""
    model.zero_grad(set_to_none=True)
    horizons = model(batch)
    counts = [int(h.mask.sum()) for h in horizons]
    coeffs = coefficients(policy, counts, LAMBDAS[: len(horizons)], fixed_denominator=batch["tokens"].numel())
    if schedule is None:
        loss = (coeffs.float() * torch.stack(horizon_sums(horizons))).sum()
        loss.backward()
        return loss.detach(), grads(model), counts
    root, stats = build_backward_schedule(schedule, chunk_rows=CHUNK_ROWS).run(horizons, coeffs)
    root.backward()
    assert stats.counts.tolist() == counts
    return (coeffs.float() * stats.loss_sums).sum(), grads(model), stats


@pytest.mark.parametrize("batch_name", list(BATCHES))
@pytest.mark.parametrize("trunk_grad", ["joint", "detached"])
@pytest.mark.parametrize("head", list(HEADS))
def test_schedules_agree_for_every_policy(head, trunk_grad, batch_name):
    model = build_model(**HEADS[head], trunk_grad=trunk_grad)
    batch = BATCHES[batch_name]()
    for policy in POLICIES:
        ref_loss, ref_grads, counts = run_schedule(model, batch, policy, None)
        if batch_name == "short_docs" and len(counts) == 4:
            assert counts[3] == 0 and min(counts[:3]) > 0  # an empty last horizon
        assert any(g.abs().max() > 0 for g in ref_grads.values())
        for schedule in SCHEDULES:
            loss, g, stats = run_schedule(model, batch, policy, schedule)
            tag = f"{policy}/{schedule}"
            assert torch.isfinite(loss) and close(ref_loss, loss), (tag, ref_loss, loss)
            assert set(g) == set(ref_grads)
            for name, ref in ref_grads.items():
                assert close(ref, g[name]), (tag, name, (ref - g[name]).abs().max().item(), ref.abs().max().item())
            if schedule != "chunked":
                assert stats.correct is not None and len(stats.correct) == len(counts)


def test_schedules_leave_no_gradient_before_the_root_backward():
    """Only root.backward() touches Parameters (one DDP synchronisation per step)."""
    model = build_model("parallel", 3)
    for schedule in SCHEDULES:
        model.zero_grad(set_to_none=True)
        horizons = model(packed_batch())
        root, _ = build_backward_schedule(schedule, chunk_rows=CHUNK_ROWS).run(horizons, torch.tensor([1.0, 0.5, 0.25]))
        assert all(p.grad is None for p in model.parameters()), schedule
        root.backward()
        assert all(p.grad is not None for p in model.trunk.parameters()), schedule


def test_schedule_registry_errors():
    with pytest.raises(ConfigError) as error:
        build_backward_schedule("eager")
    assert error.value.field == "schedule.name"
    for bad in (0, -1, 2.5):
        with pytest.raises(ConfigError) as error:
            build_backward_schedule("chunked", chunk_rows=bad)
        assert error.value.field == "schedule.chunk_rows"


@pytest.mark.parametrize("head", ["parallel", "deepseek_d3"])
def test_evaluate_horizons_matches_the_joint_statistics(head):
    model = build_model(**HEADS[head])
    batch = short_docs_batch()
    horizons = model(batch)
    _, joint = build_backward_schedule("joint").run(horizons, torch.ones(len(horizons)))
    with torch.no_grad():
        stats = evaluate_horizons(model(batch))
    reference = torch.stack([s.detach() for s in horizon_sums(horizons)])
    assert torch.allclose(stats.loss_sums, reference, rtol=1e-6, atol=1e-6)
    assert torch.equal(stats.counts, joint.counts) and torch.equal(stats.correct, joint.correct)
    for h, grid, hits in zip(horizons, stats.row_correct, stats.correct):
        assert grid.shape == h.mask.shape and not (grid & ~h.mask).any() and int(grid.sum()) == int(hits)
        logits = torch.nn.functional.linear(h.norm(h.hidden), h.weight).detach()  # [B, S-k, V]
        assert torch.equal(grid, (logits.argmax(-1) == h.labels) & h.mask)

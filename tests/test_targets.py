"""Self-distilled targets (objective.target = data | distill | mix): lab/objective/targets.py.

Oracles: a head that copies the next-token path's rows has KL 0 (and no KL gradient); the
KL gradient w.r.t. the student logits is softmax(q) − p (hand formula); mix is the stated
blend of the two sums; the gradient of the distilled term reaches the drafting head only
(the teacher path and a detached trunk get none); joint and sequential agree; chunked is refused.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from lab.errors import ConfigError
from lab.objective import build_backward_schedule
from lab.objective.objective import Objective
from lab.objective.targets import TargetConfig, attach_teachers, row_kl
from tests.helpers import build_model, grads, make_batch, packed_batch

pytestmark = pytest.mark.usefixtures("single_thread")


def run(horizons, coeffs, schedule="joint"):
    root, stats = build_backward_schedule(schedule, chunk_rows=4).run(horizons, torch.tensor(coeffs))
    root.backward()
    return stats


def copying_horizons(model, batch):
    """Horizon 2 whose rows are the next-token rows one place later: it predicts exactly what the path predicts."""
    first = model(batch)[0]
    S = batch["tokens"].shape[1]
    second = dataclasses.replace(first, k=2, offset=2, hidden=first.hidden[:, 1 : S - 1], labels=batch["tokens"][:, 2:],
                                 mask=first.mask[:, 1:] & first.mask[:, : S - 2])  # [B, S-2]
    return [first, second]


@pytest.mark.parametrize("schedule", ["joint", "sequential"])
def test_kl_is_zero_when_a_head_copies_the_next_token_distribution(schedule):
    model = build_model("identity", 1)
    horizons = attach_teachers(copying_horizons(model, packed_batch()), TargetConfig("distill"))
    stats = run(horizons, [0.0, 1.0], schedule)
    assert stats.counts[1] > 0
    assert abs(stats.loss_sums[1].item()) < 1e-6
    assert all(g.abs().max() < 1e-6 for g in grads(model).values())  # at the minimum: no gradient


def test_kl_gradient_is_student_softmax_minus_teacher():
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(5, 7, generator=g, requires_grad=True), torch.randn(5, 7, generator=g)
    kl = row_kl(F.log_softmax(student, -1), F.log_softmax(teacher, -1)).sum()  # the distill target's divergence, summed over rows
    p, q = teacher.softmax(-1), student.softmax(-1)
    torch.testing.assert_close(kl, (p * (p.log() - q.log())).sum())
    kl.backward()
    torch.testing.assert_close(student.grad, q.detach() - p)


def test_distill_gradient_reaches_only_the_drafting_head():
    model = build_model("parallel", 2, trunk_grad="detached")
    horizons = attach_teachers(model(packed_batch()), TargetConfig("distill"))
    assert not horizons[1].teacher.rows.requires_grad and not horizons[1].teacher.weight.requires_grad
    run(horizons, [0.0, 1.0])  # only the distilled horizon-2 term
    g = grads(model)
    assert all(g[n].abs().max() == 0 for n in g if n.startswith(("trunk.blocks.", "head.stacks.0.")))  # teacher path: none
    assert g["head.stacks.1.blocks.0.mlp.up.weight"].abs().max() > 0


def test_mix_is_the_stated_blend_of_cross_entropy_and_kl():
    model = build_model("parallel", 3)
    batch = packed_batch()
    sums = {}
    for target in ("data", "distill", "mix"):
        horizons = model(batch)
        # the rows both targets cover, so the three sums are over the same rows
        shared = attach_teachers(horizons, TargetConfig("distill"))
        horizons = [horizons[0]] + [dataclasses.replace(h, mask=s.mask) for h, s in zip(horizons[1:], shared[1:])]
        with torch.no_grad():
            sums[target] = run_stats(attach_teachers(horizons, TargetConfig(target, mix_alpha=0.25)))
    torch.testing.assert_close(sums["mix"][1:], 0.75 * sums["data"][1:] + 0.25 * sums["distill"][1:])
    assert torch.equal(sums["data"][0], sums["distill"][0])  # horizon 1 always learns the data (the same ops on the same rows: bitwise)


def run_stats(horizons):
    _, stats = build_backward_schedule("joint").run(horizons, torch.ones(len(horizons)))
    return stats.loss_sums


def test_distilled_rows_need_a_valid_teacher_row():
    """Row t of offset 2 is supervised by distillation only if next-token row t+1 is: a hole at t+1 drops it."""
    batch = make_batch([[11, 12, 13, 14, 15, 16]], [[0] * 6], torch.tensor([[1, 1, 1, 0, 1, 1]], dtype=torch.bool))
    model = build_model("parallel", 2)
    data, distill = model(batch), attach_teachers(model(batch), TargetConfig("distill"))
    assert data[1].mask.tolist() == [[True, False, True, False]]  # endpoints: 0→2, 2→4 (across the hole at 3)
    assert distill[1].mask.tolist() == [[True, False, False, False]]  # 2→4's teacher row 3 is the hole


@pytest.mark.parametrize("head", [dict(name="parallel", k=3), dict(name="deepseek", k=3, depth=2), dict(name="identity", k=3),
                                  dict(name="linear", k=3, offsets=[1, 2, 4])])
def test_joint_and_sequential_agree_under_distillation(head):
    results = {}
    for schedule in ("joint", "sequential"):
        model = build_model(**head)
        horizons = attach_teachers(model(packed_batch()), TargetConfig("mix", mix_alpha=0.5))
        stats = run(horizons, [1.0, 0.5, 0.25], schedule)
        results[schedule] = (stats.loss_sums, grads(model))
    torch.testing.assert_close(results["joint"][0], results["sequential"][0], rtol=1e-6, atol=1e-6)
    for name, grad in results["joint"][1].items():
        torch.testing.assert_close(results["sequential"][1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_chunked_refuses_distilled_targets_in_one_line():
    Objective.build({}, {"name": "uniform"}, {"name": "chunked", "chunk_rows": 4}, k=2, objective={"target": "data"})
    with pytest.raises(ConfigError, match=r"^objective\.target: 'distill' needs the logits, which schedule=chunked never builds") as error:
        Objective.build({}, {"name": "uniform"}, {"name": "chunked", "chunk_rows": 4}, k=2, objective={"target": "distill"})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("values, field", [({"target": "soft"}, "objective.target"), ({"target": "mix", "mix_alpha": 1.5}, "objective.mix_alpha"),
                                           ({"temperature": 2}, "objective.temperature")])
def test_bad_target_options_name_the_field(values, field):
    with pytest.raises(ConfigError) as error:
        Objective.build({}, {"name": "uniform"}, {"name": "sequential"}, k=2, objective=values)
    assert error.value.field == field


# ---- acceptance-targeted losses: tv, lk, lk_hybrid ------------------------------------------------------------------

def reference_row_loss(target: str, student: torch.Tensor, teacher: torch.Tensor, eta: float = 3.0) -> torch.Tensor:
    """Float64, written from the definitions: TV as half the L1 distance, KL as Σ p log(p/q)."""
    p, q = teacher.double().softmax(-1), student.double().softmax(-1)
    tv = 0.5 * (p - q).abs().sum(-1)  # = 1 − Σ min(p, q)
    kl = (p * (p.log() - q.log())).sum(-1)
    if target == "tv":
        return tv
    if target == "lk":
        return -torch.log(1.0 - tv)
    weight = torch.exp(-eta * (1.0 - tv)).detach()
    return weight * kl + (1.0 - weight) * tv


@pytest.mark.parametrize("target", ["tv", "lk", "lk_hybrid"])
def test_acceptance_losses_match_a_float64_reference_in_value_and_gradient(target):
    from lab.objective.targets import DIVERGENCES

    g = torch.Generator().manual_seed(1)
    student = torch.randn(6, 9, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(6, 9, generator=g, dtype=torch.float64) * 2
    ours = DIVERGENCES[target](F.log_softmax(student, -1), F.log_softmax(teacher, -1), 3.0)
    reference = reference_row_loss(target, student, teacher)
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)  # float64 end to end (no model): float64 rounding only
    grad_ours, = torch.autograd.grad(ours.sum(), student)
    grad_reference, = torch.autograd.grad(reference.sum(), student)
    torch.testing.assert_close(grad_ours, grad_reference, rtol=1e-10, atol=1e-12)
    if target != "lk_hybrid":  # finite differences (the hybrid's λ is detached on purpose: it is no derivative of a loss)
        assert torch.autograd.gradcheck(lambda s: DIVERGENCES[target](F.log_softmax(s, -1), F.log_softmax(teacher, -1), 3.0), (student,))


def test_tv_gradient_is_minus_the_acceptance_gradient_and_lk_divides_it_by_alpha():
    """d(1 − α)/dz = −dα/dz; d(−log α)/dz = −dα/dz / α (per row): LK rescales TV's gradient by 1/α."""
    from lab.objective.targets import DIVERGENCES, row_acceptance

    g = torch.Generator().manual_seed(2)
    student = torch.randn(4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    log_p = F.log_softmax(torch.randn(4, 5, generator=g, dtype=torch.float64), -1)
    alpha = row_acceptance(F.log_softmax(student, -1), log_p)
    d_alpha, = torch.autograd.grad(alpha.sum(), student)
    d_tv, = torch.autograd.grad(DIVERGENCES["tv"](F.log_softmax(student, -1), log_p, 3.0).sum(), student)
    d_lk, = torch.autograd.grad(DIVERGENCES["lk"](F.log_softmax(student, -1), log_p, 3.0).sum(), student)
    torch.testing.assert_close(d_tv, -d_alpha)
    torch.testing.assert_close(d_lk, -d_alpha / alpha.detach()[:, None])


@pytest.mark.parametrize("target", ["tv", "lk", "lk_hybrid"])
def test_acceptance_losses_are_zero_with_no_gradient_when_a_head_copies_the_path(target):
    model = build_model("identity", 1)
    horizons = attach_teachers(copying_horizons(model, packed_batch()), TargetConfig(target))
    stats = run(horizons, [0.0, 1.0], "sequential")
    assert stats.counts[1] > 0 and abs(stats.loss_sums[1].item()) < 1e-5
    assert all(g.abs().max() < 1e-5 for g in grads(model).values())


def test_ce_share_blends_the_label_into_tv_as_stated():
    model = build_model("parallel", 3)
    batch = packed_batch()
    shared = attach_teachers(model(batch), TargetConfig("tv"))
    masks = [h.mask for h in shared]
    sums = {}
    for name, cfg in {"data": TargetConfig("data"), "tv": TargetConfig("tv"), "dspark": TargetConfig("tv", ce_share=0.1)}.items():
        horizons = [dataclasses.replace(h, mask=m) for h, m in zip(model(batch), masks)]  # the same rows for all three
        with torch.no_grad():
            sums[name] = run_stats(attach_teachers(horizons, cfg))
    torch.testing.assert_close(sums["dspark"][1:], 0.1 * sums["data"][1:] + 0.9 * sums["tv"][1:])


@pytest.mark.parametrize("target", ["tv", "lk", "lk_hybrid"])
def test_joint_and_sequential_agree_under_acceptance_losses(target):
    results = {}
    for schedule in ("joint", "sequential"):
        model = build_model("parallel", 3)
        stats = run(attach_teachers(model(packed_batch()), TargetConfig(target, ce_share=0.2)), [1.0, 0.5, 0.25], schedule)
        results[schedule] = (stats.loss_sums, grads(model))
    torch.testing.assert_close(results["joint"][0], results["sequential"][0], rtol=1e-6, atol=1e-6)
    for name, grad in results["joint"][1].items():
        torch.testing.assert_close(results["sequential"][1][name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("values, field, words", [
    ({"target": "tv"}, "objective.target", "'tv' needs the logits"),
    ({"target": "mix", "ce_share": 0.1}, "objective.ce_share", "target=mix has its own"),
    ({"target": "lk", "ce_share": 1.0}, "objective.ce_share", "1 leaves no lk term"),
    ({"target": "lk_hybrid", "lk_eta": -1}, "objective.lk_eta", "must be a number in [0, inf]"),
])
def test_bad_acceptance_target_options_name_the_field(values, field, words):
    schedule = {"name": "chunked", "chunk_rows": 4} if field == "objective.target" else {"name": "sequential"}
    with pytest.raises(ConfigError) as error:
        Objective.build({}, {"name": "uniform"}, schedule, k=2, objective=values)
    assert error.value.field == field and words in str(error.value)

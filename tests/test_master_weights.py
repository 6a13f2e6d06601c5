"""Float32 master weights under bf16 (lab/training/master_weights.py).

Oracles: Adam with a constant gradient moves every step by lr (m̂ = g, v̂ = g², no decay), so after n steps
the master is w₀ − n·lr and the bf16 weight is its rounding, while plain bf16 AdamW rounds each lr step away;
a float32 model is plain AdamW bit for bit; a bf16 head-only run through the real Trainer moves its norm gains,
changes weights at lr 1e-5, resumes bitwise, and follows the float32 run's loss curve.
"""

from __future__ import annotations

import pytest
import torch

from lab.model.mtp import build_model
from lab.objective.objective import Objective
from lab.objective.weights import Progress
from lab.training.master_weights import MASTER_KEY, MasterWeightAdamW
from lab.training.optim import OptimConfig, build_optimizer
from lab.training.step import PlainOptimization, train_step
from tests.helpers import hf_llama_config, make_batch

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB = 37


def constant_gradient_steps(optimizer, parameter: torch.nn.Parameter, n: int) -> None:
    for _ in range(n):
        optimizer.zero_grad()
        parameter.grad = torch.ones_like(parameter)
        optimizer.step()


def test_small_steps_accumulate_in_the_master_and_are_rounded_away_without_it():
    lr, n = 1e-3, 10  # each step is lr; bf16 spacing below 1.0 is 2^-8, so one step (< 2^-9) rounds back to 1.0
    plain = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    constant_gradient_steps(torch.optim.AdamW([plain], lr=lr, weight_decay=0.0, eps=0.0), plain, n)
    assert torch.equal(plain.detach(), torch.ones(4, dtype=torch.bfloat16))  # the defect: 10 steps, no change

    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    optimizer = MasterWeightAdamW([{"params": [weight]}], lr=lr, weight_decay=0.0, eps=0.0)
    constant_gradient_steps(optimizer, weight, n)
    (_, master), = optimizer.pairs
    assert master.dtype == torch.float32
    torch.testing.assert_close(master.detach(), torch.full((4,), 1 - n * lr), atol=1e-6, rtol=0)  # 0.990
    assert torch.equal(weight.detach(), torch.full((4,), 0.98828125, dtype=torch.bfloat16))  # round_bf16(0.990) = 1 − 3·2^-8
    assert weight.dtype == torch.bfloat16  # the model keeps computing in bf16


def adamw_pair(model_seed: int = 0):
    torch.manual_seed(model_seed)
    return torch.nn.Linear(6, 5)


def test_a_float32_model_is_plain_adamw_bit_for_bit_with_the_same_state():
    reference_model, model = adamw_pair(), adamw_pair()
    reference = torch.optim.AdamW(reference_model.parameters(), lr=1e-2, weight_decay=0.1)
    optimizer = MasterWeightAdamW([{"params": list(model.parameters())}], lr=1e-2, weight_decay=0.1)
    assert optimizer.pairs == []  # float32 Parameters are their own masters
    for step in range(5):
        x = torch.randn(3, 6, generator=torch.Generator().manual_seed(step))
        for net, opt in ((reference_model, reference), (model, optimizer)):
            opt.zero_grad()
            net(x).square().sum().backward()
            opt.step()
    for a, b in zip(reference_model.parameters(), model.parameters()):
        assert torch.equal(a, b)  # bitwise: the subclass runs torch's AdamW step itself, the same kernels
    state = optimizer.state_dict()
    assert state.pop(MASTER_KEY) == []
    assert state.keys() == reference.state_dict().keys()
    reference.load_state_dict(state)  # interchangeable checkpoints: a plain AdamW state loads and vice versa
    optimizer.load_state_dict(reference.state_dict())


def bf16_head_model(seed: int = 0, dtype=torch.bfloat16):
    torch.manual_seed(seed)
    model = build_model({"name": "hf", "config": hf_llama_config(vocab=VOCAB, d_model=32), "dtype": "float32"},
                        {"name": "deepseek", "k": 2, "trunk_grad": "frozen", "compute_match": "none"})
    return model.to(dtype)  # the same initial weights in both precisions


def counting_batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    starts, strides = torch.randint(0, VOCAB, (8, 1), generator=g), torch.randint(1, 4, (8, 1), generator=g)
    tokens = (starts + strides * torch.arange(24)) % VOCAB  # [8, 24]
    return make_batch(tokens, torch.zeros_like(tokens))


def depth_losses(model, optimizer, scheduler, steps: int, first: int = 0) -> list[float]:
    """The depth module's (horizon 2) training loss per step, through the harness's own step."""
    objective = Objective.build({"policy": "head_mean"}, {"name": "uniform"}, {"name": "joint"}, k=model.k)
    losses = []
    for step in range(first, first + steps):
        out = train_step(model, objective, counting_batch(step), Progress(step, 0, 100), PlainOptimization(model, optimizer, scheduler, 1.0))
        losses.append(float(out.loss_sums[1] / out.counts[1]))
    return losses


def harness_optimizer(model, lr: float):
    return build_optimizer(model, OptimConfig(lr=lr, warmup_steps=0, min_lr_ratio=1.0, weight_decay=0.0), total_steps=100)


# bf16 forward noise on this model: measured max |Δ| 0.003 nats over 60 steps at lr 1e-4; plain bf16 AdamW: 0.26.
CURVE_TOLERANCE = 0.02


def test_a_bf16_head_run_follows_the_float32_loss_curve_and_plain_bf16_adamw_does_not():
    steps, lr = 60, 1e-4
    reference = bf16_head_model(dtype=torch.float32)
    float32_curve = depth_losses(reference, *harness_optimizer(reference, lr), steps)
    model = bf16_head_model()
    bf16_curve = depth_losses(model, *harness_optimizer(model, lr), steps)
    assert max(abs(a - b) for a, b in zip(bf16_curve, float32_curve)) <= CURVE_TOLERANCE
    assert float32_curve[-1] < float32_curve[0] - 0.2  # the curve being followed does descend

    plain_model = bf16_head_model()
    plain = torch.optim.AdamW([p for p in plain_model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    plain_curve = depth_losses(plain_model, plain, torch.optim.lr_scheduler.LambdaLR(plain, lambda step: 1.0), steps)
    assert max(abs(a - b) for a, b in zip(plain_curve, float32_curve)) > 5 * CURVE_TOLERANCE  # what the masters fix


def test_bf16_state_dict_round_trip_continues_bitwise_from_the_float32_masters():
    straight = bf16_head_model()
    optimizer, scheduler = harness_optimizer(straight, 3e-4)
    depth_losses(straight, optimizer, scheduler, 6)

    cut = bf16_head_model()
    first_optimizer, first_scheduler = harness_optimizer(cut, 3e-4)
    depth_losses(cut, first_optimizer, first_scheduler, 3)
    saved_model, saved_optimizer = cut.state_dict(), first_optimizer.state_dict()
    assert len(saved_optimizer[MASTER_KEY]) == len(first_optimizer.pairs) > 0
    assert {t.dtype for t in saved_optimizer[MASTER_KEY]} == {torch.float32}

    resumed = bf16_head_model(seed=1)  # other weights, replaced by the load
    resumed.load_state_dict(saved_model)
    optimizer2, scheduler2 = harness_optimizer(resumed, 3e-4)
    optimizer2.load_state_dict(saved_optimizer)
    scheduler2.load_state_dict(first_scheduler.state_dict())
    depth_losses(resumed, optimizer2, scheduler2, 3, first=3)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    for (_, a), (_, b) in zip(optimizer.pairs, optimizer2.pairs):
        assert torch.equal(a, b)


def test_a_checkpoint_of_another_model_is_refused_by_the_master_count():
    model = bf16_head_model()
    optimizer, _ = harness_optimizer(model, 1e-3)
    state = optimizer.state_dict()
    state[MASTER_KEY] = state[MASTER_KEY][:-1]
    with pytest.raises(ValueError, match="master weights do not match"):
        harness_optimizer(bf16_head_model(), 1e-3)[0].load_state_dict(state)


# ---- the real Trainer -------------------------------------------------------------------------------------------------


def test_a_bf16_head_only_lightning_run_moves_norm_gains_changes_weights_at_lr_1e_5_and_resumes_bitwise(cache_dir, tmp_path):
    from tests.fit_helpers import fit
    from tests.hf_fixtures import write_llama
    from tests.test_hf_training import NOT_MODEL

    from hydra import compose, initialize_config_dir
    from lab.train import CONF_DIR

    llama = write_llama(tmp_path / "llama")

    def cfg(*overrides: str):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose("train", overrides=[*NOT_MODEL, "model=hf", f"model.path={llama}", "model.dtype=bfloat16",
                                               f"paths.cache_dir={cache_dir}", "head=deepseek", "head.trunk_grad=frozen",
                                               "optim.warmup_steps=1", "optim.min_lr_ratio=1.0", *overrides])

    from lab.train import build

    _, fresh = build(cfg("optim.lr=3e-3"))
    before = {name: p.detach().clone() for name, p in fresh.model.named_parameters()}
    trainer, module, _ = fit(cfg("optim.lr=3e-3"), tmp_path / "straight", max_steps=6, every=6)
    after = {name: p.detach().clone() for name, p in module.model.named_parameters()}
    assert all(torch.equal(before[name], after[name]) for name in after if not name.startswith("head."))  # trunk frozen
    assert {p.dtype for p in module.model.parameters()} == {torch.bfloat16}
    optimizer = trainer.optimizers[0]
    assert {p.dtype for group in optimizer.param_groups for p in group["params"]} == {torch.float32}
    # Each norm gain is its float32 master rounded, and the master holds what bf16 rounds away (plain bf16 AdamW
    # has no master; a master not copied back leaves the gain elsewhere).
    master_of = {id(parameter): master for parameter, master in optimizer.pairs}
    gains = [p for name, p in module.model.named_parameters() if name.startswith("head.") and "norm" in name]
    assert gains and all(torch.equal(p.detach(), master_of[id(p)].to(torch.bfloat16)) for p in gains)
    assert all(not torch.equal(master_of[id(p)], p.detach().float()) for p in gains)

    # lr 1e-5: an Adam step is at most ~2 lr, below half a bf16 ulp (2^-16 · 2^e ≥ 3.05e-5) of every entry with
    # |w| ≥ 2^-7, so plain bf16 AdamW leaves all of those entries where they were; the masters carry 6 steps over.
    _, slow, _ = fit(cfg("optim.lr=1e-5"), tmp_path / "slow", max_steps=6, every=6)
    moved_large = 0
    for name, p in slow.model.named_parameters():
        large = before[name].float().abs() >= 2 ** -7  # [*p.shape] entries no single step can move
        moved_large += int((p.detach() != before[name])[large].sum()) if name.startswith("head.") else 0
    assert moved_large > 0

    fit(cfg("optim.lr=3e-3"), tmp_path / "cut", max_steps=3, every=3)
    _, resumed, _ = fit(cfg("optim.lr=3e-3"), tmp_path / "cut", max_steps=6, every=6,
                        ckpt_path=str(tmp_path / "cut" / "checkpoints" / "last.ckpt"))
    assert all(torch.equal(after[name], p.detach()) for name, p in resumed.model.named_parameters())

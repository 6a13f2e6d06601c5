"""Diagnostics callbacks: gradient norms and cosines, chain acceptance, trajectory invariance, CLI names.

Oracles: constructed gradients with known cosines (identical → 1, opposed → -1), direct
`torch.autograd.grad` on the ordinary forward, a hand-computed chain acceptance, and the
step's own gradient (Σ_k of the per-horizon gradients). End-to-end: the real CLI with the
`diagnostics` preset, read back from metrics.csv and the offline wandb run.
"""

import csv
import math

import pytest
import pytorch_lightning as pl
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from lab.callbacks.grad_diagnostics import (
    GradDiagnostics,
    forward_capturing_trunk,
    gram,
    horizon_gradients,
    norms_and_cosines,
    resolve_groups,
)
from lab.callbacks.horizon_metrics import chain_acceptance_counts
from lab.callbacks.memory_metrics import LogitLiveness
from lab.callbacks.validation_figures import ValidationFigures
from lab.errors import ConfigError
from lab.horizon import Horizon
from lab.nn.blocks import RMSNorm
from lab.training.module import MTPLitModule
from lab.training.step import local_counts
from tests.helpers import VOCAB, build_model, horizon_sums, make_batch, model_config, packed_batch
from tests.cli import TINY, lab_train, lab_train_in_process, wandb_history_keys

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread


# ---- constructed cases --------------------------------------------------------------------
class TwinHorizons(nn.Module):
    """A toy model whose two horizons are the very same rows and labels (so S_1 = S_2)."""

    def __init__(self, d: int = 8, vocab: int = 11):
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Sequential(nn.Embedding(vocab, d), nn.Linear(d, d))
        self.norm = RMSNorm(d)
        self.unembed = nn.Parameter(torch.randn(vocab, d))

    def forward(self, batch):
        hidden = self.trunk(batch["tokens"])  # [B, S, d]
        labels, mask = batch["tokens"][:, 1:], batch["active"][:, 1:]  # [B, S-1]
        return [Horizon(k, hidden[:, :-1], labels, mask, self.norm, self.unembed) for k in (1, 2)]


def per_horizon_gradients(model, batch: dict, scales, params):
    """Each horizon's gradient on a fresh forward of `model`, as the callback computes it."""
    horizons, trunk_hidden = forward_capturing_trunk(model, batch)
    return horizon_gradients(horizons, trunk_hidden, scales, params)


def metric_names(k: int, groups) -> set[str]:
    """Every name the callback's docstring promises for K horizons and the given parameter groups."""
    horizons, pairs = range(1, k + 1), [(i, j) for i in range(1, k + 1) for j in range(i + 1, k + 1)]
    names = set()
    for prefix in [""] + [f"{group}/" for group in groups]:
        names |= {f"grad/{norm}/{prefix}h{h}" for norm in ("norm", "norm_weighted") for h in horizons}
        names |= {f"grad/cos/{prefix}h{i}_h{j}" for i, j in pairs}
    names |= {f"grad/{shared}/{part}/h{h}" for shared in ("shared", "shared_weighted") for part in ("embed", "unembed") for h in horizons}
    return names | ({"grad/trunk_ratio/extra_over_main"} if k >= 2 else set())


def twin_batch():
    return make_batch(torch.arange(12).remainder(11).view(2, 6), [[0] * 6, [0] * 4 + [-1] * 2])


@pytest.mark.parametrize("sign, expected", [(1.0, 1.0), (-1.0, -1.0)])
def test_identical_losses_give_cosine_one_and_opposed_gradients_minus_one(sign, expected):
    model = TwinHorizons()
    params = dict(model.named_parameters())
    # c_2 = sign·c_1 on identical losses: g_2 = sign·g_1 in every space.
    result = per_horizon_gradients(model, twin_batch(), torch.tensor([0.7, sign * 0.7]), params)
    spaces = {"leaf": result.leaf, **result.params}
    for space, grads in spaces.items():
        norms, cos = norms_and_cosines(gram(grads))
        assert norms[0].item() > 0 and norms[0].item() == pytest.approx(norms[1].item(), rel=1e-12), space
        assert cos[0, 1].item() == pytest.approx(expected, abs=1e-9), space
        assert cos[0, 0].item() == pytest.approx(1.0, abs=1e-9)


def test_cosine_of_orthogonal_and_zero_gradients():
    norms, cos = norms_and_cosines(gram([torch.tensor([3.0, 0.0]), torch.tensor([0.0, 2.0]), torch.zeros(2)]))
    assert norms.tolist() == [3.0, 2.0, 0.0]
    assert cos[0, 1] == 0 and math.isnan(cos[0, 2]) and math.isnan(cos[2, 2])


def build_module(head: dict, n_layers: int = 3, reduction: str = "head_mean", weights: dict | None = None) -> MTPLitModule:
    torch.manual_seed(0)
    head = {"compute_match": "next_token_path", **head}  # 3 layers: K block heads beside the trunk
    cfg = model_config(n_layers)
    return MTPLitModule(
        model=dict(vars(cfg)),
        head=head,
        reduction=dict(policy=reduction, count_scope="global", fixed_denominator=None),
        weights=weights or dict(name="geometric", gamma=0.5),
        schedule=dict(name="sequential", chunk_rows=None),
        optim=dict(lr=1e-2, betas=[0.9, 0.95], weight_decay=0.1, warmup_steps=2, min_lr_ratio=0.1, grad_clip=1.0),
        total_steps=20,
    )


def direct_gradients(module, batch, weighted: bool):
    """Per horizon k, by plain autograd on the ordinary forward: d(L_k)/d(trunk output, params), L_k = S_k / N_k,
    or (weighted) d(c_k S_k)/d(...) with the step's coefficients."""
    model = module.model
    captured = {}
    handle = model.trunk.register_forward_hook(lambda mod, inp, out: captured.setdefault("hidden", out))
    horizons = model(batch)
    handle.remove()
    counts = local_counts(horizons)
    coeffs = module.objective.coefficients(counts, batch["tokens"].numel(), module.progress())
    coeffs, scale = coeffs.coefficients, coeffs.scale
    sums = horizon_sums(horizons)
    last_block = list(model.trunk.blocks[-1].parameters())
    out = []
    for k, s in enumerate(sums):
        term = (coeffs[k] * scale).float() * s if weighted else s / counts[k].float()
        leaf, embed, *block = torch.autograd.grad(term, [captured["hidden"], model.trunk.embed.weight, *last_block],
                                                  retain_graph=True, allow_unused=True)
        block = torch.cat([torch.zeros(p.numel()) if g is None else g.flatten() for g, p in zip(block, last_block)])
        leaf = torch.zeros_like(captured["hidden"]) if leaf is None else leaf
        out.append((leaf, embed if embed is not None else torch.zeros_like(model.trunk.embed.weight), block))
    return out


@pytest.mark.parametrize(
    "head",
    [dict(name="parallel", k=3), dict(name="deepseek", k=3, depth=2), dict(name="causal", k=3, trunk_grad="detached"),
     dict(name="linear", k=2, unembedding="replicated")],
    ids=["parallel", "deepseek", "causal_detached", "linear_replicated"],
)
def test_norms_cosines_and_shares_equal_direct_autograd(head):
    module = build_module(head)
    batch = packed_batch()
    callback = GradDiagnostics(every_n_steps=1)
    callback.setup(None, module, "fit")
    metrics = callback.measure(module, batch, step=0).metrics
    raw, weighted = direct_gradients(module, batch, weighted=False), direct_gradients(module, batch, weighted=True)
    k = len(raw)
    assert set(metrics) == metric_names(k, ["trunk_last", "embed", "unembed"])
    for space, index, prefix in (("leaf", 0, ""), ("embed", 1, "embed/"), ("trunk_last", 2, "trunk_last/")):
        vectors = [d[index].double().flatten() for d in raw]
        for i in range(k):
            assert metrics[f"grad/norm/{prefix}h{i + 1}"] == pytest.approx(vectors[i].norm().item(), rel=1e-5, abs=1e-9), space
            norm_weighted = weighted[i][index].double().norm().item()
            assert metrics[f"grad/norm_weighted/{prefix}h{i + 1}"] == pytest.approx(norm_weighted, rel=1e-5, abs=1e-9), space
            for j in range(i + 1, k):
                expected = (vectors[i] @ vectors[j] / (vectors[i].norm() * vectors[j].norm())).item()
                got = metrics[f"grad/cos/{prefix}h{i + 1}_h{j + 1}"]
                assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected, abs=1e-5), space
    for i in range(k):
        for name, grads in (("shared", raw), ("shared_weighted", weighted)):
            embed_norm = grads[i][1].double().norm().item()
            assert metrics[f"grad/{name}/embed/h{i + 1}"] == pytest.approx(embed_norm, rel=1e-5, abs=1e-9)
            assert metrics[f"grad/{name}/unembed/h{i + 1}"] == metrics[f"grad/{name}/embed/h{i + 1}"]  # tied: one Parameter
    extra = sum(d[0] for d in weighted[1:]).double().norm() / weighted[0][0].double().norm()
    assert metrics["grad/trunk_ratio/extra_over_main"] == pytest.approx(extra.item(), rel=1e-5, abs=1e-9)
    if head.get("trunk_grad") == "detached":  # horizons ≥ 2 send nothing to the trunk
        assert metrics["grad/norm/h2"] == 0 and metrics["grad/trunk_ratio/extra_over_main"] == 0
        assert math.isnan(metrics["grad/cos/h1_h2"])


def test_cosines_are_defined_for_horizons_with_zero_weight():
    # Forward curriculum, K = 3, step 0: λ = (1, 0, 0). The horizons' own losses still have
    # gradients, so every cosine is finite; only the λ-weighted norms of h2, h3 are 0.
    module = build_module(dict(name="parallel", k=3), weights=dict(name="curriculum_forward"))
    callback = GradDiagnostics(every_n_steps=1)
    callback.setup(None, module, "fit")
    metrics = callback.measure(module, packed_batch(), step=0).metrics
    cosines = {name: value for name, value in metrics.items() if name.startswith("grad/cos/")}
    assert len(cosines) == 4 * 3 and all(math.isfinite(v) for v in cosines.values()), cosines
    for prefix in ("", "embed/", "trunk_last/"):
        assert metrics[f"grad/norm/{prefix}h1"] > 0 and metrics[f"grad/norm_weighted/{prefix}h1"] > 0
        for h in (2, 3):
            assert metrics[f"grad/norm/{prefix}h{h}"] > 0 and metrics[f"grad/norm_weighted/{prefix}h{h}"] == 0
    assert metrics["grad/trunk_ratio/extra_over_main"] == 0


def test_per_horizon_gradients_sum_to_the_step_gradient_and_leave_state_alone():
    module = build_module(dict(name="parallel", k=3))
    batch = packed_batch()
    model = module.model
    params = dict(model.named_parameters())
    horizons = model(batch)
    coeffs = module.objective.coefficients(local_counts(horizons), batch["tokens"].numel(), module.progress())
    coeffs, scale = coeffs.coefficients, coeffs.scale
    root, _ = module.objective.backward_schedule.run(horizons, (coeffs * scale).float())
    root.backward()  # the step's own gradient (sequential schedule)
    step_grads = {n: p.grad.clone() for n, p in params.items()}
    rng = torch.get_rng_state()
    callback = GradDiagnostics(every_n_steps=1)
    callback.setup(None, module, "fit")
    before = {n: p.detach().clone() for n, p in params.items()}
    result = per_horizon_gradients(model, batch, (coeffs * scale).float(), params)
    assert torch.equal(rng, torch.get_rng_state()), "the diagnostic drew random numbers"
    for name, p in params.items():
        assert torch.equal(p.grad, step_grads[name]) and torch.equal(p.detach(), before[name]), name
        total = sum(result.params[name])
        assert (total - p.grad).abs().max() <= 1e-5 * p.grad.abs().max() + 1e-8, name


# ---- chain acceptance on a hand-made batch -------------------------------------------------
def test_chain_acceptance_hand_computed():
    T, F = True, False
    # one row, S = 6, K = 3; horizon k has S-k source rows
    masks = [torch.tensor([[T, T, T, T, T]]), torch.tensor([[T, T, T, F]]), torch.tensor([[T, T, F]])]
    correct = [torch.tensor([[T, T, F, T, T]]), torch.tensor([[T, F, T, T]]), torch.tensor([[T, T, T]])]
    # k=1: 5 valid rows, 4 correct                                      -> 4 / 5
    # k=2: rows valid at 1..2: t=0,1,2; h1 correct there: t=0,1;
    #      of those h2 correct: t=0                                      -> 1 / 2
    # k=3: rows valid at 1..3: t=0,1; h1,h2 correct: t=0; h3 correct: t=0 -> 1 / 1
    accepted, prefix_ok = chain_acceptance_counts(correct, masks)
    assert accepted.tolist() == [4, 1, 1] and prefix_ok.tolist() == [5, 2, 1]
    assert (accepted / prefix_ok).tolist() == [0.8, 0.5, 1.0]


# ---- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(every_n_steps=0), "callbacks.grad_diagnostics.every_n_steps"),
        (dict(every_n_steps=2.5), "callbacks.grad_diagnostics.every_n_steps"),
        (dict(groups={"attn": ["trunk.blocks.*.attn.*", "nope.*"]}), "callbacks.grad_diagnostics.groups.attn"),
        (dict(groups={"h2": ["trunk.*"]}), "callbacks.grad_diagnostics.groups"),
        (dict(groups={"empty": []}), "callbacks.grad_diagnostics.groups.empty"),
    ],
)
def test_bad_options_fail_at_setup(kwargs, field):
    callback = GradDiagnostics(**kwargs)
    with pytest.raises(ConfigError) as error:
        callback.setup(None, build_module(dict(name="parallel", k=2)), "fit")
    assert error.value.field == field and "\n" not in str(error.value)


def test_group_patterns_and_placeholders():
    untied = build_model("parallel", k=2, layers=3, tie=False)
    groups = resolve_groups(untied, None)
    assert [n for n, _ in groups["unembed"]] == ["trunk.unembed"]
    assert {n.split(".")[2] for n, _ in groups["trunk_last"]} == {"1"}  # 3 layers, 1 head block: trunk blocks 0..1
    tied = build_model("parallel", k=2, layers=3)
    assert [n for n, _ in resolve_groups(tied, None)["unembed"]] == ["trunk.embed.weight"]
    heads = resolve_groups(tied, {"heads": "head.stacks.*"})["heads"]
    assert heads and all(n.startswith("head.stacks.") for n, _ in heads)


# ---- the trajectory does not change ----------------------------------------------------------
class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int = 40, seq_len: int = 12):
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(1, VOCAB, (n, seq_len), generator=g)
        segments = torch.tensor([[0] * 7 + [1] * 5] * n)
        self.batch = make_batch(tokens, segments)

    def __len__(self):
        return self.batch["tokens"].shape[0]

    def __getitem__(self, i):
        return {key: value[i] for key, value in self.batch.items()}


class LossRecorder(pl.Callback):
    def __init__(self):
        self.losses, self.peaks = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())
        self.peaks.append(outputs["step"].saved_peak_bytes)


def fit_losses(diagnostics: bool, steps: int = 20):
    pl.seed_everything(0, verbose=False)
    module = build_module(dict(name="parallel", k=3))
    recorder = LossRecorder()
    memory = LogitLiveness(every_n_steps=1)  # the saved-tensor peak on every step
    callbacks = [recorder, memory] + ([GradDiagnostics(every_n_steps=1), GradDiagnostics(every_n_steps=3)] if diagnostics else [])
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, deterministic=True, callbacks=callbacks,
    )
    trainer.fit(module, train_dataloaders=DataLoader(Rows(), batch_size=4, shuffle=True))
    return recorder, {n: p.detach().clone() for n, p in module.named_parameters()}, callbacks[2:]


def test_in_step_measurement_equals_a_fresh_measurement_on_the_pre_step_weights():
    pl.seed_everything(0, verbose=False)
    module = build_module(dict(name="deepseek", k=3, depth=2))
    loader = DataLoader(Rows(), batch_size=4)
    reference = GradDiagnostics(every_n_steps=1)
    reference.setup(None, module, "fit")
    expected = reference.measure(module, next(iter(loader)), step=0).metrics
    reference.teardown(None, module, "fit")
    in_step = GradDiagnostics(every_n_steps=1)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[in_step],
    )
    trainer.fit(module, train_dataloaders=loader)
    assert in_step.latest.step == 0 and in_step.latest.metrics == expected
    assert module.step_probes == []  # teardown unregisters the probe


def test_diagnostics_leave_the_training_trajectory_unchanged():
    off, params_off, _ = fit_losses(False)
    on, params_on, (every_step, every_third) = fit_losses(True)
    assert len(off.losses) == 20 and on.losses == off.losses  # exact equality at every step (the step's own ops are the same with or without)
    assert on.peaks == off.peaks  # the measured saved-tensor peak does not see the diagnostic
    assert all(torch.equal(params_on[n], params_off[n]) for n in params_off)
    assert every_step.latest.step == 19 and every_third.latest.step == 18


# ---- figures ------------------------------------------------------------------------------------
def test_figures_written_without_wandb(tmp_path):
    module = build_module(dict(name="parallel", k=3))
    diagnostics = GradDiagnostics(every_n_steps=5)
    figures = ValidationFigures(output_dir=str(tmp_path))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=2, val_check_interval=2, check_val_every_n_epoch=None,
        num_sanity_val_steps=0, callbacks=[diagnostics, figures], default_root_dir=str(tmp_path),
    )
    loader = DataLoader(Rows(), batch_size=4)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)
    names = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert names == ["grad_cos_step000002.png", "grad_cos_step000004.png", "horizon_acc_step000002.png", "horizon_acc_step000004.png"]


# ---- end to end through the real CLI --------------------------------------------------------------
def design_names(k: int) -> set[str]:
    """Every per-step / per-validation metric name of docs/metrics.md for K horizons."""
    names = {"mem/logits_live_bytes", "mem/saved_peak_bytes"}
    for h in range(1, k + 1):
        names |= {f"{p}/h{h}" for p in ("train/loss", "val/loss", "train/acc", "train/count", "train/weight_eff", "val/chain_acc",
                                          "grad/norm", "grad/shared/embed", "grad/shared/unembed")}
        names |= {f"grad/cos/h{h}_h{j}" for j in range(h + 1, k + 1)}
    return names


def test_diagnostics_preset_logs_every_design_name_to_csv_and_wandb(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    result = lab_train(
        *TINY, "model.n_layers=5", "callbacks=diagnostics", "head=parallel", "head.k=4", "weights=curriculum_forward",
        "callbacks.grad_diagnostics.every_n_steps=4", f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    expected = design_names(4) | metric_names(4, ["trunk_last", "embed", "unembed"])
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    columns = set(rows[0])
    assert expected <= columns, sorted(expected - columns)
    grad_steps = [int(r["step"]) for r in rows if r.get("grad/norm/h1")]
    assert grad_steps == [0, 4]  # every_n_steps=4 over 6 steps, logged at the step they describe
    assert all(float(r["grad/norm/h1"]) > 0 and -1 <= float(r["grad/cos/h1_h2"]) <= 1 for r in rows if r.get("grad/norm/h1"))
    # Step 0 of the forward curriculum trains horizon 1 only (λ = 1, 0, 0, 0); every cosine is still defined.
    step0 = next(r for r in rows if r.get("grad/norm/h1") and int(r["step"]) == 0)
    cosines = {name: float(value) for name, value in step0.items() if name.startswith("grad/cos/")}
    assert len(cosines) == 4 * 6 and all(math.isfinite(v) for v in cosines.values()), cosines
    assert float(step0["grad/norm_weighted/h4"]) == 0 < float(step0["grad/norm/h4"])
    keys, _ = wandb_history_keys(run_dir)
    assert expected <= keys, sorted(expected - keys)
    assert {"val/fig/grad_cos._type", "val/fig/horizon_acc._type", "val/table/horizons._type"} <= keys
    figures = sorted(p.name for p in (run_dir / "figures").iterdir())
    assert figures == [f"{n}_step{s:06d}.png" for n in ("grad_cos", "horizon_acc") for s in (3, 6)]


def test_bad_group_pattern_is_one_line_cli_error(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    result = lab_train_in_process(
        *TINY, "callbacks=diagnostics", "head=parallel", "head.k=2", "+callbacks.grad_diagnostics.groups.attn=[trunk.attn*]",
        f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: callbacks.grad_diagnostics.groups.attn: pattern 'trunk.attn*'"), result.stderr
    assert "Traceback" not in result.stderr and not (run_dir / "checkpoints").exists()

"""Per-horizon gradient diagnostics: norms, K×K cosines, shared-parameter contributions.

Every `every_n_steps` optimizer steps (steps 0, n, 2n, ...) the callback measures, for
every horizon k, the gradient of that horizon's own loss L_k = S_k / N_k (its mean
cross-entropy over the global batch's valid rows), on the step's own batch and
pre-step weights, in

- `leaf` space: w.r.t. the trunk output hidden state [B, S, d] (what the heads consume);
- named parameter groups: w.r.t. the Parameters matched by name patterns (below);
- the shared embedding and unembedding Parameters (always).

The step itself optimises Σ_k c_k S_k (c_k from the reduction, λ schedule and count scope),
so horizon k's term in the step's gradient is w_k ∇L_k with w_k = c_k N_k (the λ-weighted
gradient). Cosines do not depend on w_k, but they stay defined where w_k = 0 (a curriculum
starts with λ_k = 0 for distant horizons): the raw gradient of L_k is measured, the weighted
one is derived from it.

Logged names (docs/metrics.md), K = number of horizons, i < j:

    grad/norm/h{k}                     ‖∇L_k‖ at the trunk output (leaf space), raw
    grad/norm_weighted/h{k}            ‖w_k ∇L_k‖: horizon k's share of the step's gradient
    grad/cos/h{i}_h{j}                 cosine of ∇L_i, ∇L_j at the trunk output
    grad/norm/{group}/h{k}             ‖∇L_k‖ on the group's Parameters (all of them, concatenated)
    grad/norm_weighted/{group}/h{k}    the same, λ-weighted
    grad/cos/{group}/h{i}_h{j}         cosine on the group's Parameters
    grad/shared/embed/h{k}             ‖∇L_k‖ on the input embedding `trunk.embed.weight`
    grad/shared/unembed/h{k}           ‖∇L_k‖ on the shared unembedding `trunk.unembedding`
                                       (with tied embeddings this is the *same* Parameter as the
                                       embedding, so both names carry the same number: the
                                       horizon's whole gradient on the tied matrix, lookup and
                                       projection uses together)
    grad/shared_weighted/{embed,unembed}/h{k}   the same two, λ-weighted
    grad/trunk_ratio/extra_over_main   ‖Σ_{k≥2} w_k ∇L_k‖ / ‖w_1 ∇L_1‖ at the trunk output (K ≥ 2):
                                       how much of the step's trunk gradient the extra horizons send

A cosine is NaN only where a gradient is zero: an empty horizon (N_k = 0), or
`head.trunk_grad=detached` at the trunk output (horizons ≥ 2 send nothing to the trunk).
Σ_k w_k ∇L_k equals the step's own gradient (before clipping). Under DDP, L_k uses the global
N_k and the gradients are summed over ranks first (parameter groups: the gradient vectors;
leaf space: the Gram matrix, since each rank's rows are different rows); with
`count_scope=local` each rank weighs its rows with its own w_k, as the step does.

Parameter groups: `groups` maps a group name to one pattern or a list of patterns, matched
with `fnmatch.fnmatchcase` (shell-style `*`, `?`, `[...]`; `*` also crosses dots) against the
names of `model.named_parameters()` (e.g. `trunk.blocks.2.attn.qkv.weight`,
`head.stacks.0.blocks.0.mlp.up.weight`, `trunk.embed.weight`). Two placeholders are
substituted first: `{last_block}` = index of the last trunk block, `{unembedding}` = the
name of the shared unembedding Parameter (`trunk.embed.weight` when tied, else
`trunk.unembed`). Every pattern must match at least one Parameter, or start-up fails with
one `ConfigError` line (`setup`, before the first step).

How, and why the training trajectory is untouched: the measurement runs *inside* the
training step, on the step's own forward graph. `lab.training.step.train_step` calls every probe
in `pl_module.step_probes` (a declared `StepProbe` hook) after the forward and the
coefficients, before the backward schedule; on a due step `on_train_batch_start` has hooked the trunk to remember its
output. The probe recomputes each horizon's L_k from the attached rows and takes one
`torch.autograd.grad(..., retain_graph=True)` per horizon w.r.t. the trunk output and the
requested Parameters. `autograd.grad` returns gradients without writing any `.grad` and
without running gradient-accumulation (or DDP) hooks; saved tensors are only read; the
model has no dropout, so no random number is drawn. The step's own backward then runs on
the same graph exactly as without the callback (tests: identical loss at every step, same
final weights, unchanged RNG state and `.grad`). Reusing the step's forward saves the
extra forward pass a separate measurement would cost (~0.3 step); autograd prunes each
per-horizon backward to the input-gradient path, plus weight gradients where a requested
Parameter sits. Cost: about one training step per measurement, amortised over `every_n_steps`
(measured by `experiments/benchmarks/diagnostics_overhead.py`; numbers in experiments/benchmarks/README.md).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn

from lab.errors import ConfigError, require_int
from lab.objective.backward import horizon_loss, supervised_rows
from lab.training.step import local_counts

FIELD = "callbacks.grad_diagnostics"
DEFAULT_GROUPS = {
    "trunk_last": ["trunk.blocks.{last_block}.*"],
    "embed": ["trunk.embed.weight"],
    "unembed": ["{unembedding}"],
}
GROUP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
GRAM_CHUNK = 1 << 22  # elements per float64 block when accumulating Gram matrices


# ---- parameter groups -------------------------------------------------------------------
def parameter_name(model: torch.nn.Module, param: torch.Tensor) -> str:
    return next(name for name, p in model.named_parameters() if p is param)


def resolve_groups(model, groups: dict | None) -> dict[str, list[tuple[str, torch.nn.Parameter]]]:
    """Group name -> [(parameter name, Parameter)], each Parameter once per group; ConfigError if a pattern matches nothing."""
    groups = DEFAULT_GROUPS if groups is None else groups
    if not hasattr(groups, "items"):
        raise ConfigError(f"{FIELD}.groups", f"must map group names to name patterns, got {groups!r}")
    named = list(model.named_parameters())
    names = [name for name, _ in named]
    placeholders = {"last_block": str(len(model.trunk.blocks) - 1), "unembedding": parameter_name(model, model.trunk.unembedding)}
    resolved = {}
    for group, patterns in groups.items():
        group = str(group)
        if not GROUP_NAME.fullmatch(group) or re.fullmatch(r"h\d+", group):
            raise ConfigError(f"{FIELD}.groups", f"bad group name '{group}': use letters, digits, '_', '.', '-' (not h<number>)")
        patterns = [patterns] if isinstance(patterns, str) else list(patterns or [])
        if not patterns:
            raise ConfigError(f"{FIELD}.groups.{group}", "needs at least one parameter-name pattern")
        chosen: dict[str, torch.nn.Parameter] = {}
        for pattern in patterns:
            concrete = str(pattern)
            for key, value in placeholders.items():
                concrete = concrete.replace("{" + key + "}", value)
            hits = [(name, p) for name, p in named if fnmatch.fnmatchcase(name, concrete)]
            if not hits:
                sample = ", ".join(names[:4] + ["..."] + names[-2:]) if len(names) > 6 else ", ".join(names)
                raise ConfigError(
                    f"{FIELD}.groups.{group}",
                    f"pattern '{pattern}' (fnmatch) matches no parameter; names look like: {sample}",
                )
            chosen.update(hits)
        resolved[group] = list(chosen.items())
    return resolved


# ---- per-horizon gradients --------------------------------------------------------------
@dataclass
class HorizonGradients:
    """Per-horizon gradients of scale_k·S_k: K entries each."""

    leaf: list[torch.Tensor]  # K × [B, S, d] at the trunk output
    params: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # parameter name -> K × param-shaped
    counts: torch.Tensor | None = None  # [K] local valid rows


class TrunkCapture:
    """Forward hook that remembers the trunk output [B, S, d] (attached to the graph)."""

    def __init__(self):
        self.output = None

    def __call__(self, module, inputs, output):
        self.output = output


def horizon_gradients(horizons, hidden: torch.Tensor, scales, params: dict[str, torch.nn.Parameter]) -> HorizonGradients:
    """Per-horizon gradients of scale_k·S_k w.r.t. `hidden` (the trunk output) and `params`, on an existing graph.

    With scale_k = 1/N_k this is the gradient of the horizon's own loss L_k; with the step's
    coefficients it is the horizon's term of the step's objective. One
    `torch.autograd.grad` per horizon with `retain_graph=True`: nothing is written to
    `.grad` and the graph stays usable for the step's own backward. autograd runs only the
    paths to the requested tensors (input-gradient paths, plus weight gradients where a
    requested Parameter sits). A horizon that does not reach a tensor (e.g. detached heads
    and the trunk output) gets zeros.
    """
    scales = torch.as_tensor(scales).detach()
    names = list(params)
    inputs = [hidden] + [params[n] for n in names]
    leaf_grads, param_grads = [], {n: [] for n in names}
    with torch.enable_grad():
        for k, horizon in enumerate(horizons):
            rows, labels = supervised_rows(horizon)  # [N_k, d], [N_k]
            loss_sum, _ = horizon_loss(rows, labels, horizon)
            term = scales[k].to(loss_sum.dtype) * loss_sum
            grads = torch.autograd.grad(term, inputs, retain_graph=True, allow_unused=True) if term.requires_grad else [None] * len(inputs)
            leaf_grads.append(torch.zeros_like(hidden) if grads[0] is None else grads[0].detach())  # [B, S, d]
            for n, g in zip(names, grads[1:]):
                param_grads[n].append(torch.zeros_like(params[n]) if g is None else g.detach())
    counts = torch.stack([h.mask.sum() for h in horizons])
    return HorizonGradients(leaf_grads, param_grads, counts)


def forward_capturing_trunk(model, batch: dict):
    """A grad-enabled forward that also returns the trunk output [B, S, d]."""
    capture = TrunkCapture()
    handle = model.trunk.register_forward_hook(capture)
    try:
        with torch.enable_grad():
            horizons = model(batch)
    finally:
        handle.remove()
    return horizons, capture.output


# ---- Gram matrices, norms, cosines ------------------------------------------------------
def gram(per_horizon: list[torch.Tensor]) -> torch.Tensor:
    """[K, K] float64 matrix of dot products <g_i, g_j> (accumulated in float64 blocks)."""
    flat = torch.stack([g.reshape(-1) for g in per_horizon])  # [K, n]
    out = torch.zeros(flat.shape[0], flat.shape[0], dtype=torch.float64, device=flat.device)
    for start in range(0, flat.shape[1], GRAM_CHUNK):
        block = flat[:, start : start + GRAM_CHUNK].double()  # [K, chunk]
        out += block @ block.T
    return out


def norms_and_cosines(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gram [K, K] -> (norms [K], cosines [K, K]; NaN where a side has zero norm)."""
    norms = g.diagonal().clamp_min(0).sqrt()  # [K]
    outer = norms[:, None] * norms[None, :]  # [K, K]
    cos = torch.where(outer > 0, g / outer.clamp_min(torch.finfo(g.dtype).tiny), torch.full_like(g, float("nan")))
    return norms, cos.clamp(-1.0, 1.0)


def extra_over_main(g: torch.Tensor) -> torch.Tensor:
    """‖Σ_{k≥2} g_k‖ / ‖g_1‖ from the Gram matrix (NaN when ‖g_1‖ = 0)."""
    extra = g[1:, 1:].sum().clamp_min(0).sqrt()
    main = g[0, 0].clamp_min(0).sqrt()
    return extra / main if main > 0 else torch.tensor(float("nan"), dtype=g.dtype)


@dataclass
class Snapshot:
    """The latest diagnostic: step, scalar metrics and the cosine matrices (for figures)."""

    step: int
    metrics: dict[str, float]
    cosines: dict[str, torch.Tensor]  # space ("leaf" or group name) -> [K, K]


# ---- the callback -----------------------------------------------------------------------
class GradDiagnostics(pl.Callback):
    """Per-horizon gradient norms and cosines every `every_n_steps` steps (see module docstring).

    In training it measures *inside* the step: on a due step, `on_train_batch_start` hooks
    the trunk to remember its output, and `lab.training.step.train_step` calls `probe` (listed in
    `pl_module.step_probes`) between the forward and the backward schedule. The metrics
    are logged straight to every logger in `on_train_batch_end`, at the step they describe
    (Lightning's `log_every_n_steps` would drop sparse steps). `measure` does the same on a
    fresh forward, for use outside a training loop.
    """

    def __init__(self, every_n_steps: int = 50, groups: dict | None = None):
        self.every_n_steps = every_n_steps
        self.groups_config = groups
        self.groups: dict[str, list[tuple[str, torch.nn.Parameter]]] = {}
        self.latest: Snapshot | None = None  # the last measurement (read by ValidationFigures)
        self._capture: TrunkCapture | None = None
        self._handle = None
        self._step: int | None = None
        self._pending: Snapshot | None = None
        self._warned = False
        self._module = None  # the LightningModule whose steps `probe` is called from (set in `setup`)

    # start-up checks: the callback is built by Hydra (which would wrap an exception raised in
    # __init__), so every check runs in `setup`, before sanity checking and the first step.
    def setup(self, trainer, pl_module, stage):
        require_int(self.every_n_steps, f"{FIELD}.every_n_steps", least=1)
        self.groups = resolve_groups(pl_module.model, self.groups_config)
        self._module = pl_module
        if self.probe not in pl_module.step_probes:
            pl_module.step_probes.append(self.probe)

    def teardown(self, trainer, pl_module, stage):
        self._release()
        if self.probe in pl_module.step_probes:
            pl_module.step_probes.remove(self.probe)

    def targets(self, model) -> dict[str, torch.nn.Parameter]:
        """Every Parameter any metric needs, by name (each once)."""
        shared = {parameter_name(model, p): p for p in (model.trunk.embed.weight, model.trunk.unembedding)}
        return {**{name: p for members in self.groups.values() for name, p in members}, **shared}

    # ---- in-step measurement --------------------------------------------------------------
    def is_due(self, trainer) -> bool:
        return trainer.global_step % self.every_n_steps == 0

    def _release(self) -> None:
        if self._handle is not None:
            self._handle.remove()
        self._handle = self._capture = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._release()
        self._pending, self._step = None, None
        if self.is_due(trainer):
            self._step = trainer.global_step
            self._capture = TrunkCapture()
            self._handle = pl_module.model.trunk.register_forward_hook(self._capture)

    def probe(self, batch, horizons, step_coeffs: torch.Tensor) -> None:
        """A `lab.training.step.StepProbe`: called after the forward, before any backward; reads the graph only."""
        capture = self._capture
        self._release()
        if capture is None or capture.output is None:
            return
        self._pending = self.latest = self.summarise(self._module, horizons, capture.output, step_coeffs, self._step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._release()
        if self._pending is not None:
            for logger in trainer.loggers:
                logger.log_metrics(self._pending.metrics, step=self._pending.step)
        elif self._step is not None and not self._warned:
            self._warned = True
            rank_zero_warn("GradDiagnostics: the training step never called its step probes; nothing was measured")
        self._pending, self._step = None, None

    # ---- the computation ------------------------------------------------------------------
    def measure(self, pl_module, batch, step: int = 0) -> Snapshot:
        """The same measurement on a fresh forward of `batch` with the module's current weights."""
        horizons, trunk_hidden = forward_capturing_trunk(pl_module.model, batch)
        coeffs = pl_module.objective.coefficients(local_counts(horizons), batch["tokens"].numel(), pl_module.progress())
        return self.summarise(pl_module, horizons, trunk_hidden, coeffs.applied, step)

    def summarise(self, pl_module, horizons, hidden, step_coeffs: torch.Tensor, step: int) -> Snapshot:
        """Per-horizon gradients -> norms, cosines, shares; `step_coeffs` as the step applies them on this rank."""
        model = pl_module.model
        counts = pl_module.all_reduce_sum(local_counts(horizons))  # [K] global N_k
        inverse_counts = torch.where(counts > 0, 1.0 / counts.clamp_min(1), torch.zeros_like(counts))  # L_k = S_k / N_k
        # This rank's term of the step (DDP averages over ranks): (c_k / W) S_k = w_k L_k, w_k = c_k N_k / W.
        weights = step_coeffs.double().to(counts.device) / pl_module.world_size * counts  # [K]
        result = horizon_gradients(horizons, hidden, inverse_counts, self.targets(model))
        k = len(result.leaf)
        leaf_gram = gram(result.leaf)  # [K, K] this rank's rows
        raw = {"leaf": pl_module.all_reduce_sum(leaf_gram)}
        weighted = {"leaf": pl_module.all_reduce_sum(leaf_gram * weights[:, None] * weights[None, :])}
        summed = {name: [pl_module.all_reduce_sum(g) for g in grads] for name, grads in result.params.items()}
        summed_weighted = {
            name: [pl_module.all_reduce_sum(g * weights[h].to(g.dtype)) for h, g in enumerate(grads)] for name, grads in result.params.items()
        }
        del result
        for group, members in self.groups.items():
            raw[group] = gram([torch.cat([summed[name][h].reshape(-1) for name, _ in members]) for h in range(k)])
            weighted[group] = gram([torch.cat([summed_weighted[name][h].reshape(-1) for name, _ in members]) for h in range(k)])
        metrics, cosines = {}, {}
        for space, g in raw.items():
            norms, cos = norms_and_cosines(g.cpu())
            weighted_norms = weighted[space].diagonal().clamp_min(0).sqrt().cpu()
            cosines[space] = cos
            prefix = "" if space == "leaf" else f"{space}/"
            for i in range(k):
                metrics[f"grad/norm/{prefix}h{i + 1}"] = float(norms[i])
                metrics[f"grad/norm_weighted/{prefix}h{i + 1}"] = float(weighted_norms[i])
                for j in range(i + 1, k):
                    metrics[f"grad/cos/{prefix}h{i + 1}_h{j + 1}"] = float(cos[i, j])
        for part, param in (("embed", model.trunk.embed.weight), ("unembed", model.trunk.unembedding)):
            name = parameter_name(model, param)
            for i in range(k):
                metrics[f"grad/shared/{part}/h{i + 1}"] = float(summed[name][i].double().norm())
                metrics[f"grad/shared_weighted/{part}/h{i + 1}"] = float(summed_weighted[name][i].double().norm())
        if k >= 2:
            metrics["grad/trunk_ratio/extra_over_main"] = float(extra_over_main(weighted["leaf"].cpu()))
        return Snapshot(step, metrics, cosines)

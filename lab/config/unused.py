"""Settings that change nothing for this run: found from the registries, refused or noted in one place.

A setting changes nothing when the run would compute exactly what it computes at the field's default:
- a head option the head never reads (each head's `unused_options`, lab/model/heads/<name>/head.py), or reads
  only under other values of its options (`unused_when`: DeepSeek's `rollout_tokens` under `rollout=teacher`);
- a `schedule` field its backward schedule never reads (`chunk_rows` outside `chunked`: each schedule's `reads`);
- with K = 1 (the next-token horizon alone), whatever shapes only horizons 2..K: `head.draft_vocab`,
  the `objective` target fields (horizon 1 always learns the data), a reduction policy whose
  coefficients equal the default policy's at K = 1 (`weighted_pair`, `global`, ... give head_mean's
  1/N; `sum` and `fixed` scale the loss and so do change the run), and a weight schedule whose λ
  equals uniform's at every step;
- at any K, a target parameter its target never reads (`objective.mix_alpha` without `mix`,
  `objective.lk_eta` without `lk_hybrid`): read off the TARGETS and DIVERGENCES registries.

The rule: a single run refuses the first with one line (exit 2, before the run folder exists); a
sweep job notes each (one `note:` line, run.json `unused_settings`) and runs with the field at its
default, because a grid crosses axes (`head=ntp,medusa reduction=weighted_pair`) and its baseline job
must still run. A key no part of the run reads (`+foo=1`) is not a setting: always refused
(lab/config/preflight.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

# Progress points and loss counts the K = 1 comparisons probe (a schedule or policy that agrees with
# the default on all of them agrees everywhere for the shipped formulas: each is piecewise in these).
_PROBE_STEPS = (0, 1, 50, 99)
_PROBE_COUNTS = ((1.0,), (7.0,), (0.0,), (123.0,))
_PROBE_DENOMINATOR = 11.0  # token positions per batch, for policies that read it


@dataclass(frozen=True)
class UnusedSetting:
    field: str  # the dotted key, e.g. "reduction.policy"
    value: object
    default: object  # what the run computes as if
    why: str
    reset: bool = True  # a sweep job runs it at its default (False: as given, which computes the same)

    def message(self) -> str:
        return f"{self.why} (it would change nothing); allowed: {_shown(self.default)} (its default)"

    def note(self) -> str:
        runs = f"runs it at {_shown(self.default)}" if self.reset else f"runs it as given (computing what {_shown(self.default)} computes)"
        return f"{self.field}={_shown(self.value)} changes nothing here: {self.why}; the job {runs}"

    @property
    def runs_as(self) -> object:
        return self.default if self.reset else self.value


def _shown(value) -> str:
    return "null" if value is None else str(value)


def unused_settings(cfg: DictConfig, head) -> list[UnusedSetting]:
    """Every setting of `cfg` that changes nothing for a run of the typed head config `head`."""
    from lab.objective.targets import TargetConfig
    from lab.schema import typed

    found = head_options_unused(head)
    objective = OmegaConf.to_container(cfg.objective, resolve=True) if cfg.get("objective") is not None else {}
    typed(TargetConfig, objective, "objective")  # every value allowed first: an unknown one is refused as such
    found += target_parameters_unused(objective)
    if cfg.get("schedule") is not None:
        found += schedule_options_unused(OmegaConf.to_container(cfg.schedule, resolve=True))
    if head.k == 1:
        found += single_horizon_unused(head, objective, OmegaConf.to_container(cfg.reduction, resolve=True),
                                       OmegaConf.to_container(cfg.weights, resolve=True), int(cfg.trainer.max_steps))
    return found


def head_options_unused(head) -> list[UnusedSetting]:
    """Options the head never reads (`unused_options`), and options it reads only under other values (`unused_when`)."""
    from lab.model.heads import HeadConfig, head_class

    common = {f.name: f.default for f in dataclasses.fields(HeadConfig)}
    own = {f.name: f.default for f in dataclasses.fields(type(head))}
    found = [UnusedSetting(f"head.{option}", getattr(head, option), common[option], f"head '{head.name}' has no use for it")
             for option in head_class(head.name).unused_options if getattr(head, option) != common[option]]
    return found + [UnusedSetting(f"head.{rule.option}", getattr(head, rule.option), own[rule.option], rule.why)
                    for rule in head_class(head.name).unused_when if rule.holds(head) and getattr(head, rule.option) != own[rule.option]]


def schedule_options_unused(schedule: dict) -> list[UnusedSetting]:
    """A `schedule` field its backward schedule never reads (`reads` of each BACKWARD_SCHEDULES class)."""
    from lab.objective.backward import BACKWARD_SCHEDULES
    from lab.objective.objective import ScheduleConfig

    name = schedule.get("name", ScheduleConfig.name)
    if name not in BACKWARD_SCHEDULES:
        return []  # ScheduleConfig names the allowed schedules
    reads = BACKWARD_SCHEDULES[name].reads
    return [UnusedSetting(f"schedule.{f.name}", schedule[f.name], f.default, f"schedule={name} never reads it")
            for f in dataclasses.fields(ScheduleConfig)
            if f.name != "name" and f.name not in reads and schedule.get(f.name, f.default) != f.default]


def target_parameters_unused(objective: dict) -> list[UnusedSetting]:
    """A target parameter the chosen target's rule and divergence never read (probed with two values)."""
    from lab.objective.targets import DIVERGENCES, TARGETS, TargetConfig

    defaults, target = TargetConfig(), objective.get("target", TargetConfig.target)
    if target not in TARGETS:
        return []  # TargetConfig names the allowed targets
    rule = TARGETS[target]
    log_q, log_p = torch.log_softmax(torch.tensor([[0.0, 1.0, 2.0]]), -1), torch.log_softmax(torch.tensor([[2.0, 0.0, 1.0]]), -1)
    divergence = rule(defaults.mix_alpha, defaults.ce_share)[1]
    reads = {
        "mix_alpha": rule(0.25, defaults.ce_share) != rule(0.75, defaults.ce_share),
        "lk_eta": divergence is not None and not torch.equal(DIVERGENCES[divergence](log_q, log_p, 1.0), DIVERGENCES[divergence](log_q, log_p, 5.0)),
    }
    return [UnusedSetting(f"objective.{name}", objective[name], getattr(defaults, name), f"target={target} never reads it")
            for name, used in reads.items() if not used and name in objective and objective[name] != getattr(defaults, name)]


def single_horizon_unused(head, objective: dict, reduction: dict, weights: dict, max_steps: int) -> list[UnusedSetting]:
    """With K = 1: the fields that shape horizons 2..K only, and objective groups equal to their defaults' formulas."""
    from lab.objective.targets import TargetConfig

    why = "it shapes horizons 2..K and head.k=1 has none"
    found = []
    if head.draft_vocab is not None:
        found.append(UnusedSetting("head.draft_vocab", head.draft_vocab, None, why))
    defaults = TargetConfig()
    for name in ("target", "ce_share", "truncate"):  # horizon 1 always learns the data, untruncated
        if name in objective and objective[name] != getattr(defaults, name):
            found.append(UnusedSetting(f"objective.{name}", objective[name], getattr(defaults, name), why))
    found += _same_coefficients(reduction, weights, max_steps)
    return found


def _same_coefficients(reduction: dict, weights: dict, max_steps: int) -> list[UnusedSetting]:
    """A reduction policy or weight schedule other than the default whose K = 1 coefficients equal the default's."""
    from lab.objective.objective import ReductionConfig
    from lab.objective.reductions import coefficients
    from lab.objective.weights import Progress, build_weight_schedule

    default_policy, default_schedule = ReductionConfig.policy, "uniform"
    schedule = build_weight_schedule(weights["name"], 1, **{key: value for key, value in weights.items() if key != "name"})
    uniform = build_weight_schedule(default_schedule, 1)
    progress = [Progress(step=min(step, max_steps - 1), consumed_tokens=step * 1000, total_steps=max_steps) for step in _PROBE_STEPS]
    found = []
    policy = reduction.get("policy", default_policy)
    denominator = reduction.get("fixed_denominator") or _PROBE_DENOMINATOR

    def of(name: str, point: Progress, counts) -> torch.Tensor:
        return coefficients(name, counts, uniform.lambdas(point), fixed_denominator=denominator)

    if policy != default_policy and all(torch.equal(of(policy, p, c), of(default_policy, p, c)) for p in progress for c in _PROBE_COUNTS):
        found.append(UnusedSetting("reduction.policy", policy, default_policy, f"with head.k=1 it gives {default_policy}'s coefficients"))
    options = {key: value for key, value in weights.items() if key != "name" and value is not None}
    if (weights["name"] != default_schedule or options) and all(
            torch.equal(schedule.lambdas(p), uniform.lambdas(p)) for p in progress):
        # Not reset in a sweep job: the group's schema is the schedule's own, and its λ is uniform's anyway.
        found.append(UnusedSetting("weights.name", weights["name"], default_schedule, "with head.k=1 its λ is uniform's [1] at every step",
                                   reset=False))
    return found


def refuse_unused(found: list[UnusedSetting]) -> None:
    """A single run: the first setting that changes nothing, as one line."""
    from lab.errors import ConfigError

    if found:
        raise ConfigError(found[0].field, found[0].message())


def settle_unused_for_sweep_job(cfg: DictConfig, found: list[UnusedSetting]) -> list[dict]:
    """A sweep job: each setting noted and set to its default in `cfg` (or kept, where it computes the same as given:
    the weights group); the records for run.json."""
    import sys

    for setting in found:
        print(f"note: {setting.note()}", file=sys.stderr, flush=True)
        if setting.reset:
            OmegaConf.update(cfg, setting.field, setting.default, merge=False)
    return [{"field": s.field, "value": s.value, "runs_as": s.runs_as, "why": s.why} for s in found]


def noted_unused_settings(run_dir: Path) -> frozenset[str]:
    """The settings that change nothing which the run in `run_dir` noted (a sweep job's, run.json `unused_settings`):
    its resume gives them again and notes them again instead of being refused."""
    try:
        record = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return frozenset()
    return frozenset(entry["field"] for entry in record.get("unused_settings") or [] if isinstance(entry, dict) and "field" in entry)

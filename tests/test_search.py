"""`hparams_search=optuna`: Hydra's real Optuna sweeper, a persistent SQLite study, the λ/γ resolver."""

import json

import optuna
import pytest
import yaml

from lab.config.resolvers import aux_lambdas
from lab.errors import ConfigError
from tests.cli import TINY, lab_train, SUBPROCESS_TIMEOUT

SEARCH = [*TINY, "model.n_layers=5", "trainer.max_steps=4", "trainer.val_check_interval=4"]


def test_aux_lambdas_are_one_then_geometric_from_lambda():
    assert aux_lambdas(0.5, 0.5, 4) == [1.0, 0.5, 0.25, 0.125]
    assert aux_lambdas(0.3, 1.0, 3) == [1.0, 0.3, 0.3]
    assert aux_lambdas(0.3, 0.5, 1) == [1.0]


@pytest.mark.slow
def test_optuna_search_of_three_trials_runs_and_resumes(tmp_path, cache_dir):
    sweep = tmp_path / "search"
    result = lab_train("experiment=search_lambda", "hydra.sweeper.n_trials=3", *SEARCH, f"hydra.sweep.dir={sweep}",
                       cache_dir=cache_dir, cwd=tmp_path, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert set(best["best_params"]) == {"search.lam", "search.gamma"}
    runs = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/run.json"))]
    assert len(runs) == 3 and all(r["status"] == "ok" for r in runs)
    for run in runs:
        lam, gamma = run["config"]["search"]["lam"], run["config"]["search"]["gamma"]
        assert 0.05 <= lam <= 1.0 and 0.2 <= gamma <= 1.0
        assert run["config"]["weights"]["lambdas"] == pytest.approx([1.0, lam, lam * gamma, lam * gamma ** 2])
    assert best["best_value"] == pytest.approx(min(r["final_metrics"]["val/loss"] for r in runs))
    assert (sweep / "report.html").exists()
    storage = f"sqlite:///{tmp_path / 'optuna-search_lambda.db'}"
    assert len(optuna.load_study(study_name="search_lambda", storage=storage).trials) == 3
    again = lab_train("experiment=search_lambda", "hydra.sweeper.n_trials=1", *SEARCH, f"hydra.sweep.dir={tmp_path / 'again'}",
                      cache_dir=cache_dir, cwd=tmp_path, timeout=SUBPROCESS_TIMEOUT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(optuna.load_study(study_name="search_lambda", storage=storage).trials) == 4  # the study resumed


def test_a_missing_optuna_sweeper_names_the_extra_that_installs_it(tmp_path):
    """The sweeper is an extra (`.[search]`): without it, Hydra cannot find `hydra/sweeper/optuna`, and pre-flight says
    which extra to install in one line. The config folder here selects a sweeper no package provides, as a missing one."""
    import shutil

    from lab.config.preflight import OPTIONAL_PLUGINS, preflight
    from lab.train import CONF_DIR

    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    search = conf / "hparams_search" / "optuna.yaml"
    search.write_text(search.read_text().replace("override /hydra/sweeper: optuna", "override /hydra/sweeper: optuna_missing"))
    OPTIONAL_PLUGINS["hydra/sweeper/optuna_missing"] = OPTIONAL_PLUGINS["hydra/sweeper/optuna"]
    try:
        with pytest.raises(ConfigError) as refused:
            preflight(["hparams_search=optuna"], conf)
    finally:
        del OPTIONAL_PLUGINS["hydra/sweeper/optuna_missing"]
    assert refused.value.field == "hparams_search" and "pip install 'mtp-lab[search]'" in str(refused.value)
    assert "\n" not in str(refused.value)

"""`hparams_search=optuna`: Hydra's real Optuna sweeper, a persistent SQLite study, the λ/γ resolver."""

import json

import optuna
import pytest
import yaml

from lab.config.resolvers import aux_lambdas
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

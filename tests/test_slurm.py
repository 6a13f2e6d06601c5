"""Slurm through Hydra's submitit launcher (the `slurm` extra), without a cluster.

`hydra/launcher=submitit_local` runs the launcher's real code path — pickling the job,
submitit's executor starting each job in its own process, results collected, the sweep
callback at the end — with submitit's local executor in place of sbatch.
"""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from lab.train import CONF_DIR
from tests.cli import TINY, lab_train, read_run, SUBPROCESS_TIMEOUT
from tests.test_sweep import FIGURES, assert_report

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")


@pytest.mark.slow
def test_two_job_sweep_through_submitits_local_executor(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = lab_train(
        "-m", *TINY, "head=ntp,parallel", "sweep_name=submitit_test", "hydra/launcher=submitit_local",
        "hydra.launcher.timeout_min=10", f"hydra.sweep.dir={sweep}", cache_dir=cache_dir, cwd=tmp_path, timeout=SUBPROCESS_TIMEOUT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Submitit 'local' sweep output dir" in result.stdout + result.stderr
    rows = assert_report(sweep, 2, FIGURES - {"effective_weights.png"})  # K=4 head_mean: uniform weights, no figure
    assert [r["head"] for r in rows] == ["ntp", "parallel"] and [r["status"] for r in rows] == ["ok", "ok"]
    for row in rows:
        run_dir = sweep / row["run_dir"]
        assert {"config.yaml", "hydra.yaml", "overrides.yaml"} <= {p.name for p in (run_dir / ".hydra").iterdir()}
        record = read_run(run_dir)
        assert record["status"] == "ok" and record["manifest"]["head"] == row["head"] and "val/loss" in record["final_metrics"]
        assert (run_dir / "checkpoints" / "last.ckpt").stat().st_size > 0
        assert (run_dir / "metrics.csv").stat().st_size > 0
    # the jobs' offline wandb runs and the report's run go under the sweep dir: one `wandb sync` finds them all
    assert len(list(sweep.glob("wandb/offline-run-*"))) == 3
    # each job ran in a process submitit started: its pickled result and logs are in the submitit folder
    job_logs = sorted(sweep.glob(".submitit/*/*_log.out"))
    results = sorted(sweep.glob(".submitit/*/*_result.pkl"))
    assert len(job_logs) == 2 and len(results) == 2, sorted(p.name for p in sweep.glob(".submitit/*/*"))


def composed(*overrides):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=list(overrides), return_hydra_config=True)


def test_slurm_launcher_config_composes_to_submitits_slurm_launcher():
    cfg = composed("hydra/launcher=slurm", "hydra.launcher.partition=gpu")
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert launcher.partition == "gpu" and launcher.submitit_folder.endswith("/.submitit/%j")
    assert launcher.tasks_per_node == cfg.trainer.devices == 1


def test_scale_experiment_gives_one_slurm_task_per_gpu():
    """Lightning's SLURMEnvironment needs tasks per node = devices and Slurm nodes = num_nodes."""
    cfg = composed("experiment=scale", "head=parallel")
    launcher, trainer = cfg.hydra.launcher, cfg.trainer
    assert launcher._target_.endswith("SlurmLauncher") and trainer.strategy._target_ == "lab.training.sharding.fsdp_strategy"
    assert launcher.tasks_per_node == launcher.gpus_per_node == trainer.devices == 8
    assert launcher.nodes == trainer.num_nodes == 2
    assert trainer.precision == "bf16-mixed" and cfg.ckpt_path == "last" and "${now:" not in str(Path(cfg.hydra.sweep.dir))
    assert cfg.model.d_model == 768 and cfg.model.n_layers == 12 and cfg.data.seq_len == 1024 and cfg.head.k == 4

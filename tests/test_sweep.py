"""Real multiruns through the `lab-train` CLI: report at the end, failed jobs, joblib, wandb runs, DDP jobs."""

import csv
import hashlib
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lab.config.checks import check_group_choice, check_horizons_fit, check_run_config
from lab.data import TASKS, check_data_config
from lab.objective import Progress
from lab.model.mtp import parameter_table
from lab.training.module import MTPLitModule
from lab.train import CONF_DIR
from tests.cli import TINY, lab_train, read_run, SUBPROCESS_TIMEOUT

FIGURES = {"val_loss_by_architecture.png", "horizon_loss_curves.png", "horizon_accuracy.png", "effective_weights.png", "logit_memory.png"}
EXPERIMENTS = (
    "quick_ablation", "head_ablation", "reduction_ablation", "weight_ablation", "deepseek_depth", "memory", "scale",
    "star_graph", "induction", "speedrun_mtp", "draft_training", "decode_ablation", "moe_balance",
)
# Experiments whose sweep crosses model sizes (already CPU-small here): their widths are kept.
SIZE_SWEEPS = {"induction"}
# Experiments on a small model=hf config (no model.d_model to narrow): their widths are kept too.
HF_CONFIGS = {"moe_balance"}
# Experiments composed and checked by their own tests: search_lambda (tests/test_search.py), pretrained_heads
# (needs a local transformers model: tests/test_hf_training.py), scaling (up to 21 M parameters: tests/test_experiment_presets.py),
# smollm2_heads (the real model: tests/test_smollm2_heads_preset.py, tests/test_smollm2.py).
TESTED_ELSEWHERE = {"search_lambda", "pretrained_heads", "scaling", "smollm2_heads"}
# Command-line values an experiment requires (`???` in its YAML).
REQUIRED = {"draft_training": ["parent=/tmp/unused-parent"]}


def runs_csv(sweep: Path) -> list[dict]:
    return list(csv.DictReader((sweep / "runs.csv").open()))


def assert_report(sweep: Path, n_rows: int, figures: set = FIGURES) -> list[dict]:
    rows = runs_csv(sweep)
    assert len(rows) == n_rows
    for name in ("report.md", "report.html"):
        assert (sweep / name).stat().st_size > 0
    assert figures <= {p.name for p in (sweep / "figures").glob("*.png")}
    return rows


def digests(paths) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(paths)}


@pytest.fixture(scope="module")
def joblib_sweep(tmp_path_factory, cache_dir):
    """3 tiny jobs in parallel (joblib, 2 workers), all expected to succeed."""
    root = tmp_path_factory.mktemp("joblib")
    sweep = root / "sweep"
    result = lab_train(
        "-m", *TINY, "head=ntp,parallel,deepseek", "sweep_name=joblib_test", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep}", cache_dir=cache_dir, cwd=root,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep


@pytest.fixture(scope="module")
def failing_sweep(tmp_path_factory, cache_dir):
    """Basic launcher, 3 jobs: a normal one, one whose loss diverges (lr 1e30), one refused at start-up (lr < 0)."""
    root = tmp_path_factory.mktemp("failing")
    sweep = root / "sweep"
    result = lab_train("-m", *TINY, "head=parallel", "optim.lr=3e-3,1e30,-1", f"hydra.sweep.dir={sweep}", cache_dir=cache_dir, cwd=root)
    return sweep, result


def test_joblib_multirun_writes_report(joblib_sweep):
    rows = assert_report(joblib_sweep, 3)
    assert [r["head"] for r in rows] == ["ntp", "parallel", "deepseek"] and {r["status"] for r in rows} == {"ok"}
    assert rows[1]["val/loss/h4"] and rows[2]["val/loss/h2"] and float(rows[0]["run_time_s"]) > 0


def test_failed_jobs_are_recorded_and_the_sweep_completes(failing_sweep):
    sweep, result = failing_sweep
    assert result.returncode == 1, result.stderr[-3000:]  # the sweep ran to the end, report written, failures signalled
    assert "error: sweep: 2 of 3 jobs failed" in result.stderr
    # the 2 jobs that trained + the report (the refused job never started a wandb run)
    assert f"wandb: 3 offline runs; sync them with: wandb sync {sweep}/wandb/offline-run-*" in result.stderr
    # one completed K=4 head_mean job: every horizon weighs 0.25, so the weights figure is left out
    rows = assert_report(sweep, 3, FIGURES - {"effective_weights.png"})
    assert not (sweep / "figures" / "effective_weights.png").exists()
    assert [r["status"] for r in rows] == ["ok", "failed", "failed"]
    assert rows[0]["error"] == "" and float(rows[0]["val/loss"]) > 0
    assert rows[1]["error"].startswith("FloatingPointError: non-finite loss at step ")
    assert rows[2]["error"] == "config error: optim.lr: must be a number > 0, got -1.0"
    ok_dir = sweep / rows[0]["run_dir"]
    assert read_run(ok_dir)["status"] == "ok" and (ok_dir / "checkpoints" / "last.ckpt").exists()
    nan_run = read_run(sweep / rows[1]["run_dir"])
    assert nan_run["status"] == "failed" and nan_run["error"] == rows[1]["error"]
    md = (sweep / "report.md").read_text()
    assert "non-finite loss at step" in md and "optim.lr: must be a number > 0" in md and "1 ok, 2 failed" in md
    assert "Traceback" not in result.stderr


@pytest.mark.slow  # 25–50 s of one worker (tests/README.md)
def test_lab_report_rebuild_is_idempotent_and_figures_deterministic(joblib_sweep, tmp_path):
    files = [joblib_sweep / n for n in ("runs.csv", "report.md", "report.html")] + sorted((joblib_sweep / "figures").glob("*.png"))
    before = digests(files)
    result = subprocess.run(["lab-report", str(joblib_sweep)], check=False, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert digests(files) == before
    outs = []
    for i in range(2):
        out = tmp_path / f"paper{i}"
        run = subprocess.run([sys.executable, "-m", "analysis.paper_figures", str(joblib_sweep), "--out", str(out)], check=False, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
        assert run.returncode == 0, run.stderr[-2000:]
        outs.append(digests(out.glob("*")))
        assert "deepseek_lambda_effect: skipped (λ is constant (1) in every chain run" in run.stdout  # weights=uniform
    assert outs[0] == outs[1] and {"table_s4_architectures.tex", "medusa_head_accuracy.pdf", "medusa_head_accuracy.svg"} <= set(outs[0])


def wandb_run_infos(sweep_dir: Path) -> list[dict]:
    """The run records of every offline wandb run under <sweep dir>/wandb, read back with `wandb leet inspect`."""
    infos = []
    for path in sorted(sweep_dir.glob("wandb/offline-run-*")):
        out = subprocess.run(["wandb", "leet", "inspect", "--json", str(path)], check=False, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        records = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        infos.append(next(r for r in records if r.get("type") == "run")["run"])
    return infos


def test_each_job_is_its_own_wandb_run_under_the_sweep_dir(joblib_sweep):
    infos = wandb_run_infos(joblib_sweep)  # one `wandb sync <sweep dir>/wandb/offline-run-*` finds them all
    jobs = [info for info in infos if info["job_type"] != "report"]
    assert len({info["run_id"] for info in jobs}) == 3
    assert [info["run_group"] for info in jobs] == ["joblib_test"] * 3
    assert sorted(info["job_type"] for info in jobs) == ["deepseek", "ntp", "parallel"]
    (report_run,) = [info for info in infos if info["job_type"] == "report"]  # the runs table and figures
    assert report_run["run_group"] == "joblib_test"
    assert not any((joblib_sweep / r["run_dir"] / "wandb").exists() for r in runs_csv(joblib_sweep))


@pytest.mark.slow  # 25–45 s alone (tests/README.md)
def test_ddp_job_inside_a_multirun_runs_the_sweep_once(tmp_path, cache_dir):
    """Lightning starts rank 1 by re-running argv; inside a sweep that must be this one job, not the sweep again."""
    result = lab_train("-m", *TINY, "trainer=ddp_cpu", "hydra/launcher=basic", cache_dir=cache_dir, cwd=tmp_path, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert log.count("Launching 1 jobs locally") == 1, log[-3000:]
    sweeps = [p.parent for p in tmp_path.glob("multirun/*/*/multirun.yaml")]
    assert len(sweeps) == 1, sweeps
    jobs = [p for p in sweeps[0].iterdir() if p.is_dir() and (p / ".hydra").is_dir()]
    assert len(jobs) == 1 and not (tmp_path / "outputs").exists()
    assert (jobs[0] / "train_ddp_process_1.log").exists()  # rank 1 ran as a single run inside this job's directory
    assert read_run(jobs[0])["status"] == "ok"
    assert [r["status"] for r in runs_csv(sweeps[0])] == ["ok"]


def sweep_jobs(name: str):
    params = yaml.safe_load((Path(CONF_DIR).parent / "experiments" / f"{name}.yaml").read_text())["hydra"]["sweeper"]["params"]
    keys = list(params)
    for combo in itertools.product(*[str(params[k]).split(",") for k in keys]):
        yield [f"{k}={v}" for k, v in zip(keys, combo)]


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_job_composes_and_builds(name):
    """Each job of each experiment sweep composes, passes the start-up checks and builds its model."""
    text = (Path(CONF_DIR).parent / "experiments" / f"{name}.yaml").read_text().splitlines()
    assert text[0] == "# @package _global_" and text[1] == f"# lab-train experiment={name}"
    seen = set()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for overrides in sweep_jobs(name):
            # narrow models keep this fast; depth, K and every structural choice are the experiment's own
            narrow = [] if name in SIZE_SWEEPS | HF_CONFIGS else ["model.d_model=32", "model.n_heads=2"]  # a size sweep's widths are its point
            small = [*narrow, "paths.output_dir=/tmp/unused", *REQUIRED.get(name, [])]
            if name == "scale":
                small.append("trainer.accelerator=cpu")  # trainer=fsdp asks for GPUs; the check for one is tested elsewhere
            cfg = compose("train", overrides=[f"experiment={name}", *overrides, *small], return_hydra_config=True)
            assert cfg.hydra.mode.name == "MULTIRUN" and cfg.sweep_name == name
            check_run_config(cfg)
            if cfg.data.source in TASKS:  # a generated data set checks itself without files (scale names its corpus at launch)
                check_data_config(OmegaConf.to_container(cfg.data, resolve=True))
            model = OmegaConf.to_container(cfg.model, resolve=True)
            if model.get("name") != "hf":  # a model=hf config has its own vocabulary
                model["vocab_size"] = model["vocab_size"] or cfg.data.get("vocab_size") or 259
            parts = {key: OmegaConf.to_container(cfg[key], resolve=True) for key in ("head", "reduction", "weights", "schedule", "optim", "objective")}
            module = MTPLitModule(model=model, total_steps=int(cfg.trainer.max_steps), **parts)
            check_horizons_fit(module.model.k, cfg.data.seq_len, module.model.head_cfg.offsets)
            job = json.dumps({key: OmegaConf.to_container(cfg[key], resolve=True)
                              for key in ("data", "model", "head", "reduction", "weights", "schedule", "objective", "trainer")} | {"init_from": cfg.init_from, "seed": cfg.seed},
                             sort_keys=True)
            assert job not in seen, f"{name}: {overrides} repeats another job's configuration"
            seen.add(job)
            table = parameter_table(module.model)
            if name in ("quick_ablation", "head_ablation"):  # the paper's compute matching, ≥ 2 trunk blocks everywhere
                assert table["compute_match"] == "blocks" and table["blocks_total"] == cfg.model.n_layers, (overrides, table)
                assert table["blocks_trunk"] >= 2, (overrides, table)
            if name == "quick_ablation":
                assert module.model.k == (1 if cfg.head.name == "ntp" else 4)
            if name == "speedrun_mtp" and cfg.head.name == "identity":  # the record's schedule over thirds of training
                schedule, total = module.objective.weight_schedule, cfg.trainer.max_steps
                assert [schedule.live_horizons(Progress(s, 0, total)) for s in (0, total // 3, 2 * total // 3)] == [3, 2, 1]
            if name == "draft_training":  # the two-stage jobs start from the parent with a frozen trunk; joint from scratch
                frozen = cfg.variant != "joint"
                assert (cfg.init_from == "/tmp/unused-parent") == frozen and (cfg.head.trunk_grad == "frozen") == frozen
                assert table["blocks_trunk"] == cfg.model.n_layers  # the parent's trunk shape (compute_match=none)


def test_empty_experiment_lists_the_experiments_with_descriptions(tmp_path):
    check_group_choice("experiment", ["null"], Path(CONF_DIR))  # optional group: null is an allowed choice (pre-flight's group check)
    result = lab_train("experiment=", cache_dir=tmp_path, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("experiments (lab-train experiment=NAME")
    listed = {line.split()[0]: line.split(None, 1)[1] for line in lines[1:]}
    assert set(listed) == {*EXPERIMENTS, *TESTED_ELSEWHERE}
    assert listed["quick_ablation"].startswith("The main job: next-token prediction (ntp) vs the five")

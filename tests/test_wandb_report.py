"""wandb Reports of a sweep (wandb-workspaces), tested through their dry run: no network.

The sweep is real (the `lab-train -m` CLI, wandb offline); its runs are read back from their
local wandb files with wandb's own reader and converted by the same pure function that
converts runs fetched from the public API.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.report.records import Sweep, record_from_wandb, sweep_from_wandb_runs
from lab.report.wandb_local import local_runs
from lab.report.wandb_report import DRY_RUN_FILE, INSTALL_HINT, config_key, job_configs, publish
from tests.cli import SUBPROCESS_TIMEOUT, TINY, cli_env, command_in_process, lab_report, lab_train, one_error_line

GROUP = "wandb_report_test"
HORIZON_BASES = ("val/loss", "train/loss", "val/acc", "val/chain_acc")
HIDE_EXTRA = "import sys; sys.modules['wandb_workspaces'] = None; "  # Python's own way to make an import fail


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory, cache_dir):
    """Two parallel-head jobs, K = 2 and 3, with report.wandb_publish on (offline: writes the dry run)."""
    root = tmp_path_factory.mktemp("wandb_report")
    sweep = root / "sweep"
    result = lab_train("-m", *TINY, "head=parallel", "head.k=2,3", f"sweep_name={GROUP}", "report.wandb_publish=true",
                       f"hydra.sweep.dir={sweep}", cache_dir=cache_dir, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"lab-report {sweep} --wandb ENTITY/mtp-lab --group {GROUP} --publish" in result.stderr
    return sweep


def report_md_findings(sweep: Path) -> list[str]:
    lines = (sweep / "report.md").read_text().splitlines()
    start = lines.index("## Findings") + 2
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("- "))
    return lines[start:end]


def panel_grids(report: dict) -> list[dict]:
    return [block for block in report["spec"]["blocks"] if block["type"] == "panel-grid"]


def panels(report: dict) -> list[dict]:
    return [panel for grid in panel_grids(report) for panel in grid["metadata"]["panelBankSectionConfig"]["panels"]]


def plotted_keys(report: dict) -> set[str]:
    return {metric for panel in panels(report) for metric in panel["config"].get("metrics", [])}


def markdown(report: dict) -> str:
    return next(block["content"] for block in report["spec"]["blocks"] if block["type"] == "markdown-block")


def filters(runset: dict) -> list[tuple]:
    return [(f["key"]["section"], f["key"]["name"], f["op"], f["value"]) for f in runset["filters"]["filters"]]


def assert_sweep_report(report: dict, sweep: Path, runs: list[dict]) -> None:
    """The brief's contract: project and group filter, a panel per present horizon key, grouping keys, findings."""
    assert report["project"] == {"entityName": "test-entity", "name": "mtp-lab"}
    jobs = [rs for grid in panel_grids(report) for rs in grid["metadata"]["runSets"] if rs["name"] != "report run"]
    assert jobs and all(filters(rs) == [("run", "group", "=", GROUP), ("run", "jobType", "!=", "report")] for rs in jobs)
    assert all(rs["grouping"] == [{"section": "config", "name": "head.value.k"}] for rs in jobs)  # the sweep's one dimension
    logged = {key for run in runs if run["job_type"] != "report" for row in run["history"] for key in row}
    horizon = {f"{base}/h{k}" for base in HORIZON_BASES for k in (1, 2, 3, 4)}
    present = horizon & logged
    assert present == {f"{base}/h{k}" for base in HORIZON_BASES for k in (1, 2, 3)}  # K ≤ 3: no run logged h4
    line_plots = [p for p in panels(report) if p["viewType"] == "Run History Line Plot" and len(p["config"]["metrics"]) == 1]
    per_key = sorted(p["config"]["metrics"][0] for p in line_plots)
    assert per_key == sorted(present)  # one panel per present key, none for h4
    assert all(p["config"]["xAxis"] == "trainer/global_step" for p in line_plots)
    assert "/h4" not in json.dumps(report)
    # The end-of-training decoding evaluation (lab.callbacks.decoding) logs decode/*: a panel per logged key.
    decode_logged = {key for key in logged if key.startswith("decode/")}
    assert decode_logged and {key for key in plotted_keys(report) if key.startswith("decode/")} == decode_logged
    bars = {p["config"]["metrics"][0]: p["config"] for p in panels(report) if p["viewType"] == "Bar Chart"}
    assert bars["val/loss"]["xAxisMin"] == 0 and bars["val/loss"]["vertical"] is True
    coordinates = next(p for p in panels(report) if p["viewType"] == "Parallel Coordinates Plot")
    assert [c["accessor"] for c in coordinates["config"]["columns"]] == ["config:head.value.k", "summary:val/loss"]
    findings = report_md_findings(sweep)
    assert len(findings) >= 3 and "\n".join(findings) in markdown(report)


def test_report_from_converted_offline_runs(sweep_dir, tmp_path):
    runs = local_runs(sweep_dir)
    assert sorted(run["job_type"] for run in runs) == ["parallel", "parallel", "report"]
    converted = sweep_from_wandb_runs(runs, source=f"wandb:test-entity/mtp-lab/{GROUP}", name=GROUP)
    assert [r["k"] for r in converted.records] == [2, 3] and {r["status"] for r in converted.records} == {"ok"}
    out = tmp_path / "converted.json"
    publish(converted, job_configs(runs), entity="test-entity", project="mtp-lab", group=GROUP, workspace=True, dry_run=out)
    built = json.loads(out.read_text())
    assert_sweep_report(built["report"], sweep_dir, runs)
    workspace = built["workspace"]
    assert (workspace["entity"], workspace["project"]) == ("test-entity", "mtp-lab")
    runset = workspace["spec"]["section"]["runSets"][0]
    assert filters(runset) == [("run", "group", "=", GROUP), ("run", "jobType", "!=", "report")]
    assert runset["grouping"] == [{"section": "config", "name": "head.value.k"}]
    sections = [s["name"] for s in workspace["spec"]["section"]["panelBankConfig"]["sections"]]
    headings = [b["children"][0]["text"] for b in built["report"]["spec"]["blocks"] if b["type"] == "heading"]
    assert sections == ["Findings", *headings]


def test_cli_dry_run_equals_the_sweep_end_publish(sweep_dir, tmp_path):
    """`lab-report SWEEP --publish --dry-run` and report.wandb_publish build the same Report, byte for byte."""
    out = tmp_path / "cli.json"
    result = lab_report(str(sweep_dir), "--wandb", "test-entity/mtp-lab", "--publish", "--dry-run", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"dry run written to {out}" in result.stdout
    report = json.loads(out.read_text())["report"]
    assert_sweep_report(report, sweep_dir, local_runs(sweep_dir))
    at_sweep_end = json.loads((sweep_dir / DRY_RUN_FILE).read_text())["report"]
    assert at_sweep_end["project"] == {"entityName": "", "name": "mtp-lab"}  # logger.wandb.entity unset
    assert at_sweep_end["spec"] == report["spec"]
    assert "workspace" not in json.loads(out.read_text())


def synthetic_run(head: str, k: int, seed: int, decode: bool) -> dict:
    history = [{"trainer/global_step": step, "grad/cos/leaf/h1_h2": 0.1, **{f"val/loss/h{h}": 3.0 + 0.1 * h for h in range(1, k + 1)}}
               for step in range(3)]
    summary = {"val/loss": 3.1, **{f"val/loss/h{h}": 3.0 + 0.1 * h for h in range(1, k + 1)}}
    if decode:
        summary.update({"decode/tokens_per_forward": 1.7, "decode/accept/p1": 0.6, "decode/accept/p2": 0.3, "decode/speedup": 1.2})
    return {"id": f"{head}{seed}", "name": f"{head}-k{k}", "state": "finished", "group": "g", "job_type": head,
            "config": {"head": {"name": head, "k": k}, "seed": seed}, "summary": summary, "history": history}


def synthetic_report(tmp_path: Path, decode: bool) -> dict:
    runs = [synthetic_run(head, k, seed, decode) for head, k in (("parallel", 3), ("deepseek", 3)) for seed in (0, 1)]
    sweep = Sweep(name="g", source="synthetic", records=[record_from_wandb(run, i) for i, run in enumerate(runs)])
    out = tmp_path / f"decode_{decode}.json"
    publish(sweep, job_configs(runs), entity="e", project="p", group="g", dry_run=out)
    return json.loads(out.read_text())["report"]


def test_decoding_panels_only_when_runs_log_decode_metrics(tmp_path):
    with_decode, without = synthetic_report(tmp_path, True), synthetic_report(tmp_path, False)
    decoding = {"decode/tokens_per_forward", "decode/accept/p1", "decode/accept/p2", "decode/speedup"}
    assert decoding <= plotted_keys(with_decode) and not any(k.startswith("decode/") for k in plotted_keys(without))
    assert plotted_keys(with_decode) - plotted_keys(without) == decoding
    headings = [b["children"][0]["text"] for b in with_decode["spec"]["blocks"] if b["type"] == "heading"]
    assert "Decoding" in headings and "Decoding" not in json.dumps(without)
    # seeds are one variant, so the grouping is the head and K, never the seed
    grids = panel_grids(with_decode)
    assert grids[0]["metadata"]["runSets"][0]["grouping"] == [{"section": "config", "name": "head.value.name"}]
    for report in (with_decode, without):  # the report run's gradient-cosine figure, from its own run set
        grid = next(g for g in panel_grids(report) if g["metadata"]["runSets"][0]["name"] == "report run")
        assert filters(grid["metadata"]["runSets"][0]) == [("run", "group", "=", "g"), ("run", "jobType", "=", "report")]
        assert [p["config"]["mediaKeys"] for p in grid["metadata"]["panelBankSectionConfig"]["panels"]] == [["figures/grad_cosine"]]
    titles = {p["config"]["metrics"][0]: p["config"].get("chartTitle") for p in panels(with_decode) if p["config"].get("metrics")}
    assert "teacher-forced" in titles["val/loss/h2"] and "teacher-forced" not in titles["val/loss/h1"]  # docs/metrics.md


def test_dimensions_resolve_to_the_keys_wandb_holds():
    configs = [{"head": {"name": "parallel", "k": 4, "init": "random"}, "seq_len": 32, "optim": {"lr": 0.003}},
               {"head": {"name": "causal", "k": 4, "init": "random"}, "seq_len": 64, "optim": {"lr": 0.01}}]
    assert config_key("head", {"parallel", "causal"}, configs) == "head.name"  # a group choice → the group's name field
    assert config_key("data.seq_len", {"32", "64"}, configs) == "seq_len"  # Lightning logs DataModule arguments at top level
    assert config_key("optim.lr", {"3e-3", "1e-2"}, configs) == "optim.lr"  # same number, other spelling
    assert config_key("optim.lr", {"3e-3", "2e-2"}, configs) is None  # values that no config holds
    assert config_key("trainer.max_steps", {"5", "6"}, configs) is None


def test_a_head_by_k_grid_groups_by_k_although_ntps_k_resolves_to_one():
    """The README's grid (head=ntp,parallel,deepseek head.k=2,4 seed=0,1): ntp's K is 1 and DeepSeek's depth follows K,
    so no config's values are the override values; grouping by head.name alone would average K=2 with K=4."""
    jobs = [("ntp", "2", 1, None), ("parallel", "2", 2, None), ("parallel", "4", 4, None), ("deepseek", "2", 2, 1), ("deepseek", "4", 4, 3)]
    configs = []
    for seed in (0, 1):
        for head, k_override, k, depth in jobs:
            overrides = [f"head={head}", f"head.k={k_override}", f"seed={seed}"] + ([f"head.depth={depth}"] if depth else [])
            configs.append({"head": {"name": head, "k": k, "depth": depth}, "seed": seed, "overrides": overrides})
    assert config_key("head", {"ntp", "parallel", "deepseek"}, configs) == "head.name"
    assert config_key("head.k", {"2", "4"}, configs) == "head.k"
    assert config_key("head.depth", {"1", "3"}, configs) == "head.depth"
    configs[2]["head"]["k"] = 2  # a K=4 parallel job that logged K=2: K no longer tells the two apart
    assert config_key("head.k", {"2", "4"}, configs) is None


def test_missing_extra_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "never.json"
    line = one_error_line(lab_report("--wandb", "e/p", "--group", "g", "--publish", "--dry-run", str(out), prelude=HIDE_EXTRA))
    assert line == f"error: --publish: needs the optional package wandb-workspaces; install it with: {INSTALL_HINT}"
    assert not out.exists()
    code = HIDE_EXTRA + "sys.argv[0] = 'lab-train'; from lab.train import main; main()"
    result = subprocess.run([sys.executable, "-c", "import sys; " + code, "-m", *TINY, "report.wandb_publish=true", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                            cwd=tmp_path, env=cli_env(tmp_path / "cache"), capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT, check=False)
    assert result.returncode == 2 and "report.wandb_publish: needs the optional package wandb-workspaces" in result.stderr, result.stderr[-2000:]
    assert not list((tmp_path / "sweep").glob("*/run.json"))  # refused before any job ran


def test_publish_bad_arguments(tmp_path):
    """In this process (a real process refusing: test_missing_extra_is_one_line_and_writes_nothing)."""
    assert "give --publish and/or --workspace" in one_error_line(command_in_process("lab-report", "--wandb", "e/p", "--group", "g", "--dry-run", str(tmp_path / "x.json")))
    assert "--wandb: --publish/--workspace need ENTITY/PROJECT" in one_error_line(command_in_process("lab-report", str(tmp_path), "--publish"))
    assert "--wandb needs --group NAME" in one_error_line(command_in_process("lab-report", "--wandb", "e/p", "--publish"))
    assert "no such directory" in one_error_line(command_in_process("lab-report", str(tmp_path / "missing"), "--wandb", "e/p", "--publish", "--dry-run", str(tmp_path / "y.json")))
    assert not (tmp_path / "x.json").exists() and not (tmp_path / "y.json").exists()

"""The report page and the options a researcher reached for (issue #69 items 7-9): a title that says what the sweep
varied (`--title`), several sweep folders in one report, a page whose figures are not last, tables without empty
columns, short plan lines before a sweep, and the wandb dry run viewed offline and published later.

The sweeps are written as `lab-train -m` leaves them (tests/test_report.py `fake_job`), once per module; no training.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab.report.build import build_report
from lab.report.records import collect_sweep
from lab.report.wandb_report import publish
from tests.browser import CHROMIUM, needs_chromium, probe_page, screenshot
from tests.cli import REPO, SUBPROCESS_TIMEOUT, cli_env, command_in_process, one_error_line
from tests.test_report import fake_job

SHOTS = os.environ.get("REPORT_SHOTS")  # a folder to keep the screenshots in (e.g. /tmp/report_shots); else the test's own


def write_sweep(root: Path, heads: list[str], seeds=(0, 1), edit=None) -> Path:
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    for job, (head, seed) in enumerate(itertools.product(heads, seeds)):
        run_dir = fake_job(root, job, head, seed)
        payload = json.loads((run_dir / "run.json").read_text())
        payload["manifest"]["corpus_fingerprint"] = "ab" * 32
        if edit:
            edit(payload)
        (run_dir / "run.json").write_text(json.dumps(payload))
        (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in payload["overrides"]))
    return root


def longer_and_other_corpus(payload: dict) -> None:
    payload["overrides"] = [o.replace("trainer.max_steps=20", "trainer.max_steps=40") for o in payload["overrides"]]
    payload["manifest"]["corpus_fingerprint"] = "cd" * 32


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    root = tmp_path_factory.mktemp("report_page")
    return {
        "a": write_sweep(root / "a", ["ntp", "parallel", "deepseek"]),  # 6 jobs, nothing failed
        "b": write_sweep(root / "b", ["ntp", "parallel"], seeds=(2, 3)),  # the same settings, two more seeds
        "c": write_sweep(root / "c", ["deepseek"], edit=longer_and_other_corpus),  # another corpus, twice the steps
        "root": root,
    }


@pytest.fixture(scope="module")
def built(sweeps):
    """The 6-job sweep's report, default title."""
    out = sweeps["root"] / "built"
    build_report(collect_sweep(sweeps["a"]), out)
    return out


def test_the_default_title_says_what_the_sweep_varied_and_title_sets_page_markdown_and_wandb(sweeps, built, tmp_path):
    page, md = (built / "report.html").read_text(), (built / "report.md").read_text()
    assert "<title>head × seed, 6 jobs</title>" in page and "<h1>head × seed, 6 jobs</h1>" in page
    assert md.startswith("# head × seed, 6 jobs\n")
    out = tmp_path / "titled"
    result = command_in_process("lab-report", str(sweeps["a"]), "--out", str(out), "--title", "Heads on our code <v2>")
    assert result.returncode == 0, result.stderr
    assert "<title>Heads on our code &lt;v2&gt;</title>" in (out / "report.html").read_text()
    assert "<h1>Heads on our code &lt;v2&gt;</h1>" in (out / "report.html").read_text()
    assert (out / "report.md").read_text().startswith("# Heads on our code <v2>\n")
    sweep = collect_sweep(sweeps["a"])
    configs = [{"head": {"name": r["head"], "k": r["k"]}, "seed": r["seed"], "overrides": r["overrides"]} for r in sweep.records]
    dry = tmp_path / "dry.json"
    publish(sweep, configs, entity="e", project="p", group="fake_sweep", dry_run=dry)
    assert json.loads(dry.read_text())["report"]["displayName"] == "head × seed, 6 jobs"
    publish(sweep, configs, entity="e", project="p", group="fake_sweep", dry_run=dry, title="Heads on our code")
    assert json.loads(dry.read_text())["report"]["displayName"] == "Heads on our code"


def test_a_dimension_that_follows_from_the_others_is_not_named_in_the_title(tmp_path):
    """The 3 × 2 × 2 grid after the K rules: ntp has no head.k, deepseek's head.depth follows head.k."""
    from lab.report.render import default_title
    from lab.report.records import Sweep

    grid = [["head=ntp", "seed=0"], ["head=ntp", "seed=1"]] + [
        [f"head={h}", f"head.k={k}", f"seed={s}", *([f"head.depth={k - 1}"] if h == "deepseek" else [])]
        for h in ("parallel", "deepseek") for k in (2, 4) for s in (0, 1)]
    records = [{"overrides": job} for job in grid]
    assert default_title(Sweep("train", "x", records)) == "head × head.k × seed, 10 jobs"


def test_several_sweep_folders_make_one_report_of_their_pooled_runs(sweeps, tmp_path):
    out = tmp_path / "pooled"
    result = command_in_process("lab-report", str(sweeps["a"]), str(sweeps["b"]), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "10 ok, 0 failed" in result.stdout
    md = (out / "report.md").read_text()
    assert md.startswith("# head × seed, 10 jobs from 2 sweeps\n")
    variants = md.split("## Variants")[1].split("\n## ")[0]
    assert "| head=ntp | ntp | 1 | 4 / 4 |" in variants and "| head=deepseek | deepseek | 4 | 2 / 2 |" in variants
    jobs = md.split("## Jobs")[1]
    assert "| job | sweep folder | overrides |" in jobs and "| 9 | b | head=parallel seed=3 |" in jobs
    assert not (sweeps["a"] / "report.md").exists()  # the folders themselves are only read


def test_incompatible_sweep_folders_are_refused_in_one_line_and_nothing_is_written(sweeps, tmp_path):
    out = tmp_path / "refused"
    line = one_error_line(command_in_process("lab-report", str(sweeps["a"]), str(sweeps["c"]), "--out", str(out)))
    assert "not one comparable set of runs" in line
    assert f"data corpus fingerprint {'ab' * 6}… (a) vs {'cd' * 6}… (c)" in line and "trainer.max_steps 20 (a) vs 40 (c)" in line
    assert "settings that no folder varies must match" in line
    assert not out.exists()
    line = one_error_line(command_in_process("lab-report", str(sweeps["a"]), str(sweeps["b"])))
    assert line == "error: --out: required with several sweep folders (2 given): where their pooled report goes"
    line = one_error_line(command_in_process("lab-report", str(sweeps["a"]), str(sweeps["a"]), "--out", str(out)))
    assert "given twice" in line and not out.exists()
    from lab.report.pooling import pool_sweeps

    # a setting one folder varies is no reason to refuse: its jobs ran 30 and 40 steps, a's 20
    swept = write_sweep(tmp_path / "swept", ["deepseek"], seeds=(5, 6), edit=lambda p: p.update(overrides=[
        o.replace("trainer.max_steps=20", f"trainer.max_steps={30 if p['config']['seed'] == 6 else 40}") for o in p["overrides"]]))
    assert len(pool_sweeps([collect_sweep(sweeps["a"]), collect_sweep(swept)]).records) == 8


def test_tables_have_no_empty_columns(built, tmp_path):
    md = (built / "report.md").read_text()
    jobs = md.split("## Jobs")[1]
    assert "failure reason" not in jobs  # nothing failed: no column of blanks
    assert "failure reason" not in (built / "report.html").read_text().split('id="jobs"')[1]
    failing = write_sweep(tmp_path / "failing", ["ntp"], seeds=(0,))
    fake_job(failing, 1, "ntp", 1, status="failed", error="FloatingPointError: non-finite loss at step 7")
    report = build_report(collect_sweep(failing), failing)
    assert "| failure reason |" in report.markdown.read_text()


def nav_probe(html: Path, width: int) -> dict:
    """At `width` px: the page height, the first figure's top, the nav links and the ids they miss."""
    return probe_page(html, width, """<script>
const links = [...document.querySelectorAll('nav.toc a')].map(a => a.getAttribute('href'));
const img = document.querySelector('img');
document.title = JSON.stringify({height: document.documentElement.scrollHeight, links,
  missing: links.filter(h => !h.startsWith('#') || !document.getElementById(h.slice(1))),
  firstFigure: img ? img.getBoundingClientRect().top + window.scrollY : null,
  jobs: document.getElementById('jobs') ? document.getElementById('jobs').getBoundingClientRect().top + window.scrollY : null});
</script></body>""")


@needs_chromium
def test_the_page_has_a_navigation_bar_and_its_figures_come_before_the_job_tables(built):
    """At 1,400 px the 6-job page had its first figure at 2,691 px, after every table (9,083 px long, figures last)."""
    page = built / "report.html"
    seen = nav_probe(page, 1400)
    assert seen["missing"] == [] and len(seen["links"]) >= 6, seen
    assert {"#findings", "#variants", "#figures", "#jobs"} <= set(seen["links"]), seen
    assert seen["firstFigure"] is not None and seen["firstFigure"] < 1800, seen
    assert seen["jobs"] is not None and seen["firstFigure"] < seen["jobs"], seen  # the figures come before the per-job table
    shots = Path(SHOTS or page.parent)
    shots.mkdir(parents=True, exist_ok=True)
    assert screenshot(page, shots / "report_1400_top.png", 1400, 1800).stat().st_size > 20_000  # drawn, not a blank page


def test_the_wandb_dry_run_renders_as_a_local_page(sweeps, tmp_path):
    sweep = collect_sweep(sweeps["a"])
    configs = [{"head": {"name": r["head"], "k": r["k"]}, "seed": r["seed"], "overrides": r["overrides"]} for r in sweep.records]
    dry = tmp_path / "dry.json"
    publish(sweep, configs, entity="e", project="p", group="fake_sweep", dry_run=dry, workspace=True, title="Heads")
    result = command_in_process("lab-report", "--view", str(dry), "--out", str(tmp_path / "view.html"))
    assert result.returncode == 0 and "wandb report view:" in result.stdout, result.stderr
    page = (tmp_path / "view.html").read_text()
    assert "<title>Heads (wandb dry run)</title>" in page and '<h1 id="report">Heads</h1>' in page and '<h1 id="workspace">' in page
    assert "<h2>Per-horizon loss</h2>" in page and "<code>val/loss/h4</code>" in page  # sections and their panels' metrics
    assert "<h2>Findings</h2>" in page and "Lowest validation next-token loss" in page  # the Markdown block, rendered
    assert "runs: fake_sweep jobs — group = &#x27;fake_sweep&#x27; and jobType != &#x27;report&#x27;; grouped by" in page
    from lab.report.wandb_view import write_view

    assert write_view(dry) == tmp_path / "dry.view.html"  # default: next to the file
    assert "no such file" in one_error_line(command_in_process("lab-report", "--view", str(tmp_path / "none.json")))
    (tmp_path / "other.json").write_text('{"runs": []}')
    assert "not a lab-report --dry-run file" in one_error_line(command_in_process("lab-report", "--view", str(tmp_path / "other.json")))
    if CHROMIUM and SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        screenshot(tmp_path / "view.html", Path(SHOTS) / "wandb_dry_run_view_1400.png", 1400, 1800)


def test_publishing_a_dry_run_later_checks_its_arguments_and_refuses_without_network_in_one_line(sweeps, tmp_path):
    sweep = collect_sweep(sweeps["a"])
    configs = [{"head": {"name": r["head"], "k": r["k"]}, "seed": r["seed"], "overrides": r["overrides"]} for r in sweep.records]
    dry = tmp_path / "dry.json"
    publish(sweep, configs, entity="e", project="p", group="fake_sweep", dry_run=dry)
    assert "ENTITY/PROJECT, got 'nowhere'" in one_error_line(command_in_process("lab-report", "--publish-from", str(dry), "nowhere"))
    assert "no such file" in one_error_line(command_in_process("lab-report", "--publish-from", str(tmp_path / "x.json"), "e/p"))
    assert "give the dry-run JSON file and where" in one_error_line(
        command_in_process("lab-report", str(sweeps["a"]), "--publish-from", str(dry), "e/p"))
    before = dry.read_bytes()
    env = {k: v for k, v in cli_env().items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path), WANDB_BASE_URL="http://127.0.0.1:9", WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"), PYTHONPATH=str(REPO))
    code = "import sys; from lab.report.cli import main; main(sys.argv[1:])"
    result = subprocess.run([sys.executable, "-c", code, "--publish-from", str(dry), "someone/somewhere"], env=env,
                            capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    line = one_error_line(result)
    assert line.startswith("error: --publish-from: report not saved to someone/somewhere: ") and "run this again later" in line
    assert dry.read_bytes() == before


def test_plan_lines_before_a_sweep_are_short_and_keep_what_the_grid_does(tmp_path, capsys):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from lab.run.grid_sweeper import GridSweeper

    sweeper = GridSweeper.__new__(GridSweeper)  # Hydra's plugin scan may re-import BasicSweeper: skip its __init__
    sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    sweeper.hydra_context = None
    fixed = ["data.path=/home/researcher/projects/our-code/python", "trainer.max_steps=150", "trainer.val_check_interval=50",
             "data.val_fraction=0.25", "callbacks.humaneval.problems=8", "callbacks.decoding=null", "model.d_model=64"]
    overrides = OverridesParser.create().parse_overrides(["head=ntp,parallel,deepseek", "head.k=2,4", "seed=0,1", *fixed])
    batches = sweeper.split_arguments(overrides, None)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert max(map(len, lines)) <= 120, max(lines, key=len)
    assert sum(len(batch) for batch in batches) == 10
    assert "sweep grid: head × head.k × seed = 12 grid points: head=ntp,parallel,deepseek head.k=2,4 seed=0,1" in lines
    assert "sweep grid: ntp fixes K = 1: head.k=2,4 dropped from its jobs" in err
    assert "head=ntp head.k=4 seed=0 = #0, head=ntp head.k=4 seed=1 = #1" in err
    assert "sweep grid: deepseek derives from head.k: head.k=2 → head.depth=1, head.k=4 → head.depth=3" in lines
    assert err.count("data.path=/home/researcher/projects/our-code/python") == 1  # the shared settings, said once
    assert "sweep plan: 10 jobs" in err and "  #9: head=deepseek head.k=4 seed=1 head.depth=3" in lines


def test_a_multirun_job_has_no_progress_bar_even_when_its_config_asks_for_one():
    """The tests' own overrides turn bars off (tests/cli.py TINY), so the sweep tests never see this rule: checked here."""
    from hydra.conf import HydraConf
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from lab.train import progress_bar

    cfg = OmegaConf.create({"trainer": {"enable_progress_bar": True}})
    saved = HydraConfig.instance().cfg
    try:
        for mode, shown in ((RunMode.RUN, True), (RunMode.MULTIRUN, False)):
            hydra = OmegaConf.create({"hydra": OmegaConf.structured(HydraConf)})
            hydra.hydra.mode = mode
            HydraConfig.instance().set_config(hydra)
            assert progress_bar(cfg) is shown, mode
    finally:
        HydraConfig.instance().cfg = saved

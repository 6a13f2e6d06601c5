"""Trunk families and heads from an installed package (lab/config/plugins.py): an entry point of the group
`mtp_lab.plugins` is imported before lab-train checks its command line, so `model=<its family>` is a real option.

The package here is a folder on PYTHONPATH holding the plugin module and its `*.dist-info` (what pip writes for an
installed distribution): importlib.metadata finds its entry point exactly as it finds an installed one's.
"""

from __future__ import annotations

import json
import sys

import pytest

from lab.config.plugins import load_plugins
from lab.errors import ConfigError
from tests.cli import REPO, TINY, lab_train
from tests.fit_helpers import searchpath_with
from tests.toy_trunk import SCALED_YAML


def install_plugin(site, module: str, source: str) -> None:
    """`site/module.py` and a `*.dist-info` declaring it as the entry point `module` of the group mtp_lab.plugins."""
    (site / f"{module}.py").write_text(source)
    info = site / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[mtp_lab.plugins]\n{module} = {module}\n")


def test_lab_train_runs_a_trunk_family_an_installed_plugin_registers(tmp_path, cache_dir):
    site = tmp_path / "site"
    site.mkdir()
    install_plugin(site, "scaled_plugin", "from lab.model.trunk_spec import register_trunk\nfrom tests.toy_trunk import SCALED\n\n"
                                          "register_trunk(SCALED)\n")
    searchpath = searchpath_with(tmp_path, "model", "scaled", SCALED_YAML)  # the family's YAML beside conf/
    run_dir = tmp_path / "run"
    result = lab_train(*TINY, searchpath, "model=scaled", "head=parallel", "head.k=2", "trainer.max_steps=2",
                       "callbacks.decoding.prompts=0", f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path,
                       env={"PYTHONPATH": f"{REPO}:{site}"})
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "ok" and record["config"]["model"]["name"] == "scaled"
    assert record["config"]["model"]["embed_gain"] == 2.0  # its own option, from its YAML


def test_a_plugin_that_fails_to_import_is_named_in_one_line(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    install_plugin(site, "broken_plugin", "raise RuntimeError('no GPU driver here')\n")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(ConfigError) as refused:
        load_plugins()
    assert str(refused.value) == ("plugins: the plugin 'broken_plugin' (broken_plugin, entry point group mtp_lab.plugins) failed "
                                  "to import: RuntimeError: no GPU driver here")
    sys.modules.pop("broken_plugin", None)


SWALLOWING_PLUGIN = """\
import pathlib, time
pathlib.Path({ready!r}).write_text("importing")
try:  # a bare except around an optional import, as some libraries have: it catches Ctrl-C too
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
except:  # noqa: E722
    pass
"""


def test_a_ctrl_c_that_an_import_swallows_still_stops_lab_train_in_one_line(tmp_path, cache_dir):
    """A library that catches the KeyboardInterrupt while it imports (here a plugin, imported before the checks) does not
    lose the Ctrl-C: lab-train stops once the imports are done, with the start-up line, 130 and no run folder."""
    import os
    import signal

    from tests import cli

    site, ready, run_dir = tmp_path / "site", tmp_path / "ready", tmp_path / "run"
    site.mkdir()
    install_plugin(site, "swallowing_plugin", SWALLOWING_PLUGIN.format(ready=str(ready)))
    process = cli.start_lab_train(*TINY, "trainer.max_steps=2", f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path,
                                  env={"PYTHONPATH": f"{REPO}:{site}"})
    try:
        cli.wait_for(ready, process, "the plugin's import began")
        os.killpg(process.pid, signal.SIGINT)
        stderr = process.communicate(timeout=cli.SUBPROCESS_TIMEOUT)[1]
    finally:
        cli.kill_session(process)
    assert process.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1].startswith("interrupted: lab-train stopped by SIGINT"), stderr
    assert not run_dir.exists()

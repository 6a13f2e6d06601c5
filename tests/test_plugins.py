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

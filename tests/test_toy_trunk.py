"""A new trunk family is one module (config, trunk, spec), one registry line and one YAML (docs/trunks.md,
"Adding a trunk family").

The toy family (tests/toy_trunk.py) is defined outside lab/: the harness's GPT with its token embeddings scaled by a
learned scalar before the first block (`embed_gain`, an option of its own). It is registered with
`register_trunk` (removed after each test) and its YAML sits in a temporary config folder on Hydra's search
path. Nothing else in the harness is told about it: the real config composes `model=scaled head=parallel`, a real
Trainer trains it, and the registry-built checks (tests/test_trunk_registry.py) hold for it.
"""

from __future__ import annotations

import pytest

from lab.model.trunk_spec import TRUNK_SPECS, register_trunk, unregister_trunk
from tests.fit_helpers import compose_cfg, fit, searchpath_with
from tests.test_trunk_registry import check_family
from tests.toy_trunk import SCALED, SCALED_YAML, ScaledTrunk

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def scaled_family():
    register_trunk(SCALED)  # the one registry line
    yield SCALED
    unregister_trunk(SCALED.name)


def test_a_trunk_family_defined_outside_lab_composes_trains_and_passes_the_registry_checks(scaled_family, tmp_path):
    scaled_conf = searchpath_with(tmp_path, "model", "scaled", SCALED_YAML)  # its YAML outside conf/
    cfg = compose_cfg(scaled_conf, "model=scaled", "head=parallel", "head.k=2", "callbacks.decoding.prompts=0", cache_dir=tmp_path / "cache")
    assert (cfg.model.name, cfg.model.embed_gain, cfg.head.name) == ("scaled", 2.0, "parallel")  # its YAML and schema
    _, module, _ = fit(cfg, tmp_path / "run", max_steps=4)
    assert isinstance(module.model.trunk, ScaledTrunk)
    assert module.model.trunk.embed_gain.item() != 2.0  # its own parameter trained
    check_family(SCALED)


def test_its_config_is_checked_by_its_own_class_and_it_leaves_no_trace_once_removed(scaled_family):
    from lab.errors import ConfigError
    from lab.model.mtp import model_config

    with pytest.raises(ConfigError, match=r"^model\.embed_gain: must be > 0, got -1"):
        model_config({**SCALED.example, "embed_gain": -1})
    unregister_trunk("scaled")
    assert "scaled" not in TRUNK_SPECS
    with pytest.raises(ConfigError, match=r"^model\.name: unknown trunk family 'scaled'"):
        model_config(SCALED.example)
    register_trunk(SCALED)  # for the fixture's own removal

"""Code outside lab/ that registers trunk families or head architectures: Python entry points of the group
`mtp_lab.plugins` in any installed distribution (docs/trunks.md, docs/heads.md: "from your own package").

A plugin is a module whose import calls `register_trunk(...)` or `register_head(...)`; its package declares it
in pyproject.toml:

    [project.entry-points."mtp_lab.plugins"]
    scaled = "my_lab_parts.scaled"

`lab-train` imports every plugin before it checks the command line (and again in each sweep job's process, where
Hydra's launcher may run the job): `model=scaled` then names a registered family. A plugin that fails to import
stops the run with one line naming it.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from lab.errors import ConfigError

GROUP = "mtp_lab.plugins"


def load_plugins() -> list[str]:
    """Import every installed plugin (each once per process: a module is imported once); returns their names."""
    loaded = []
    for point in sorted(entry_points(group=GROUP), key=lambda p: p.name):
        try:
            importlib.import_module(point.module)
        except Exception as error:  # noqa: BLE001  (any failure of someone else's code: one line, not a traceback)
            raise ConfigError("plugins", f"the plugin '{point.name}' ({point.value}, entry point group {GROUP}) failed to "
                                         f"import: {type(error).__name__}: {error}") from None
        loaded.append(point.name)
    return loaded

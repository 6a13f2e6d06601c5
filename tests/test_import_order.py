"""Each decoding-core and head module imports on its own, first, in a fresh import of lab.

Heads import the decoding core's modules (tree, sampling, proposer) and the building blocks (lab.nn);
release layouts import the heads' registry. A module whose imports start a package that comes back to
it would find itself half-initialised when it is imported first: the layout test sees no cycle between
modules, only this import order shows it.
"""

from __future__ import annotations

import subprocess
import sys

from tests.cli import REPO, SUBPROCESS_TIMEOUT, cli_env

FIRST_IMPORTS = """
import importlib, pkgutil, sys
import torch  # loaded once: only lab's modules are imported afresh
packages = ("lab.nn", "lab.decode_core", "lab.model.heads", "lab.release")
modules = [p + "." + m.name for p in packages for m in pkgutil.iter_modules(importlib.import_module(p).__path__)] + ["lab.decode"]
for module in modules:
    for name in [n for n in sys.modules if n == "lab" or n.startswith("lab.")]:
        del sys.modules[name]
    try:
        importlib.import_module(module)
    except ImportError as error:
        print(f"{module}: {error}")
print(len(modules), "modules")
"""


def test_every_core_and_head_module_imports_first():
    result = subprocess.run([sys.executable, "-c", FIRST_IMPORTS], cwd=REPO, env=cli_env(), capture_output=True, text=True,
                            timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:-1] == [] and int(lines[-1].split()[0]) >= 20, result.stdout  # 9 core and 12 head modules, lab.decode

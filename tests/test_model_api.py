"""`lab.model` public API (docs/api.md): build_model re-exported without an import cycle."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cli import SUBPROCESS_TIMEOUT


@pytest.mark.parametrize("first", ["lab.model", "lab.model.mtp", "lab.model.heads", "lab.model.trunk", "lab.nn.flops", "lab.decode"])
def test_build_model_imports_from_lab_model_whatever_loads_first(first):
    # A fresh interpreter per order: an import cycle shows up only for some first imports.
    code = (f"import {first}\n"
            "from lab.model import build_model, MTPModel\n"
            "m = build_model({'vocab_size': 13, 'd_model': 32}, {'name': 'deepseek', 'depth': 2})\n"
            "assert isinstance(m, MTPModel) and m.k == 3 and m.model_cfg.vocab_size == 13\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert done.returncode == 0, done.stderr

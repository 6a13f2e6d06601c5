"""Every bad input the fault campaign found (issue 26), through the real `lab-train` CLI in an empty
working directory: one line on stderr naming the field, no traceback, a non-zero exit, and no
folder left anywhere under the working directory (the run folder is never made, or removed
when the refused attempt made nothing else)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import TINY, lab_train

CONFIG_CASES = [
    (["model.d_model=-8"], "model.d_model"),
    (["optim.lr=-1"], "optim.lr"),
    (["optim.betas=[0.9]"], "optim.betas"),
    (["trainer.val_check_interval=0"], "trainer.val_check_interval"),
    (["trainer.devices=0"], "trainer.devices"),
    (["trainer.accelerator=tpu"], "trainer.accelerator"),
    (["trainer.log_every_n_steps=-1"], "trainer.log_every_n_steps"),
    (["data.max_val_rows=0"], "data.max_val_rows"),
]


def everything_under(folder: Path) -> set[Path]:
    return {path.relative_to(folder) for path in folder.rglob("*")}


def assert_refused_in_one_line(result, field: str, cwd: Path, before: set[Path]) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), result.stderr[-2000:]
    assert everything_under(cwd) == before, sorted(map(str, everything_under(cwd) - before))


@pytest.mark.parametrize("overrides, field", CONFIG_CASES, ids=[case[0][0] for case in CONFIG_CASES])
def test_a_bad_config_value_is_refused_before_any_folder_exists(tmp_path, cache_dir, overrides, field):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = lab_train(*TINY, *overrides, cache_dir=cache_dir, cwd=cwd, timeout=600)
    assert_refused_in_one_line(result, field, cwd, set())

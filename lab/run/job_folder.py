"""A sweep job's folder name after its number: the settings that vary across the sweep's jobs.

e.g. `3-head:parallel+k:4+seed:0`: keys shortened to their last part where that stays unambiguous;
in a value, a character other than letters, digits, `.`, `-` becomes `_`. No `=` or `,`: the folder can
be given back to Hydra unquoted (`hydra.run.dir=…/3-head:parallel+k:4+seed:0`, as lab-resume does). None when nothing
varies: the folder keeps `<num>-<run name>`. `0-parallel-k4` … `3-parallel-k4` for four different
jobs told a reader nothing. The grid sweeper sets each job's `hydra.sweep.subdir` from it
(lab/run/grid_sweeper.py).
"""

from __future__ import annotations

import re

MAX_NAME = 120  # characters of a job folder's settings part
UNSAFE = r"[^\w.-]"  # characters of a value that become `_` in a folder name (a path's `/`, quotes, spaces)


def override_item(override: str) -> tuple[str, str]:
    """'+head.k=4' → ('head.k', '4')."""
    key, _, value = str(override).partition("=")
    return key.lstrip("+~"), value


def job_settings(task: list[str], jobs: list[list[str]]) -> str | None:
    """`task`: this job's overrides; `jobs`: every job's of the sweep."""
    per_job = [dict(override_item(o) for o in job) for job in jobs]
    varying = {key for job in per_job for key in job if len({other.get(key) for other in per_job}) > 1}  # absent counts as a value
    items = [override_item(o) for o in task if override_item(o)[0] in varying]
    if not items:
        return None
    last = [key.rsplit(".", 1)[-1] for key, _ in items]
    names = [short if last.count(short) == 1 else key for (key, _), short in zip(items, last)]
    text = "+".join(f"{name}:{re.sub(UNSAFE, '_', value)}" for name, (_, value) in zip(names, items))
    return text[:MAX_NAME]

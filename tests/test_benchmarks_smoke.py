"""Smoke runs of the benchmark scripts (`--quick`): they run to the end and print their ratio lines.

Not timed tests: a timing goal may print PASS or MISS (the machine may be busy). A structural goal
— one that counts bytes or compares tokens, whatever the load — must print PASS.
"""

import pathlib
import re
import subprocess
import sys

import pytest
from tests.cli import SUBPROCESS_TIMEOUT

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]

EXPECTED = {
    "harness_overhead": ["paired vs plain", "harness / plain", "goal <= 1.03", "plain+meter / plain"],
    "logit_memory": ["peak/joint", "(peak-base)/logit", "goals at V=4096, K=2:", "sequential peak <= 0.35 x joint",
                     "(peak-base)/logit_bytes within 15% [joint]"],
    "logit_memory_pretrained": ["model=hf tiny Llama", "peak/joint", "goals at V=49152, K=2:", "chunked peak    <= 0.15 x joint"],
    "mtp_overhead": ["vs ntp", "paired vs ntp", "goal at V=259, K=4: step time <= 1.05 x ntp"],
    "data_scale": ["disk B/token", "loader ktok/s", "goal <= 4 bytes/token on disk",
                   "goal loader tokens/s >= 20 x training tokens/s"],
    "cli_startup": ["paired help / import pytorch_lightning", "goal: lab-train --help median <= 1.5 s"],
    "diagnostics_overhead": ["amortised overhead (direct)", "c = with/without - 1", "goal <= 3%"],
    "decode_speed": ["cached / uncached speed (paired)", "same tokens: True", "batched requests: plain vs speculative throughput by batch size",
                     "spec/plain throughput (paired)"],
    "decode_round_ops": ["aten ops per round", "speculative round", "goal: greedy proposal + acceptance <= 5 ops per round"],
    "gpu_throughput": ["tokens/s", "MFU", "paired vs ntp", "goal: parallel K=4 FLOP throughput >= 0.9 x ntp (eager)"],
    "hidden_cache": ["cached / live (paired, CPU time)", "where the cached step's time goes", "goal: cached step <= 0.5 x live frozen step"],
    "hidden_cache_draft_vocab": ["draft vocabulary N = 512", "cached / live (paired, CPU time)", "goal: cached step <= 0.5 x live frozen step"],
    "draft_vocab": ["draft stage ms [IQR]", "decode / full", "goal: draft stage at N=512 <= 0.5 x full vocabulary"],
}
# Goal lines (a text each contains) whose verdict does not depend on timing: they must say PASS.
STRUCTURAL = {
    "logit_memory": ["(peak-base)/logit_bytes within 15% [joint]", "(peak-base)/logit_bytes within 15% [sequential]"],
    "logit_memory_pretrained": ["(peak-base)/logit_bytes within 15% [joint]", "(peak-base)/logit_bytes within 15% [sequential]"],
    "data_scale": ["goal <= 4 bytes/token on disk", "goal peak memory (PSS) growth < 1 GiB at every size"],
    "decode_round_ops": ["goal: greedy proposal + acceptance <= 5 ops per round"],
}
# Extra arguments of a --quick run: gpu_throughput's compiled variants take minutes to compile on CPU
# (model.compile itself is tested in tests/test_compile.py); a peak so that MFU is printed on CPU.
EXTRA_ARGS = {"gpu_throughput": ["--no-compile", "--peak", "1e11"], "decode_speed": ["--batch", "1,2", "--prompts", "2", "--prompt-tokens", "8"],
              "logit_memory_pretrained": ["--pretrained"], "hidden_cache_draft_vocab": ["--draft-vocab", "512"],
              "draft_vocab": ["--sizes", "512", "--repeats", "2", "--tokens", "8"]}
MODULES = {"logit_memory_pretrained": "logit_memory", "hidden_cache_draft_vocab": "hidden_cache"}  # a second --quick run of one script, with EXTRA_ARGS


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick_run(name):
    result = subprocess.run([sys.executable, "-m", f"experiments.benchmarks.{MODULES.get(name, name)}", "--quick", *EXTRA_ARGS.get(name, [])], check=False, cwd=ROOT,
                            capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    for text in EXPECTED[name]:
        assert text in result.stdout, f"{text!r} missing from:\n{result.stdout}"
    assert ("PASS" in result.stdout) or ("MISS" in result.stdout)
    for goal in STRUCTURAL.get(name, []):
        line = next(line for line in result.stdout.splitlines() if goal in line)
        assert "PASS" in line and "MISS" not in line, line


def test_decode_speed_against_peers_quick(tmp_path):
    """`decode_speed --peers` on a tiny local Llama: every harness decoder emits harness plain's tokens (a structural check)."""
    from tests.hf_fixtures import write_llama

    folder = write_llama(tmp_path / "llama")
    result = subprocess.run([sys.executable, "-m", "experiments.benchmarks.decode_speed", "--quick", "--skip-cache-part", "--peers", str(folder)],
                            check=False, cwd=ROOT, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if re.search(r"\s(code|text)\s+harness ", line)]
    assert "== peers" in result.stdout and "transformers prompt lookup" in result.stdout and len(rows) == 2 * 5, result.stdout
    assert all(line.rstrip().endswith("True") for line in rows), result.stdout

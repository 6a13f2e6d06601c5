"""Smoke runs of the benchmark scripts (`--quick`): they run to the end and print their ratio lines.

Not timed tests: a timing goal may print PASS or MISS (the machine may be busy), but its verdict must
be the one its own printed number gives (`goal_verdicts`). A structural goal — one that counts bytes
or compares tokens, whatever the load — must print PASS.
"""

import pathlib
import re
import subprocess
import sys
import tempfile

import pytest
from tests.cli import SUBPROCESS_TIMEOUT

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
    "oracle_heads": ["independent heads vs the marginal oracle", "oracle tok/fwd", "heads' share ="],
    "numerics_spread": ["native                         1 thread(s): val/loss", "spread (max − min) over"],
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
              "draft_vocab": ["--sizes", "512", "--repeats", "2", "--tokens", "8"],
              "numerics_spread": ["--workdir", tempfile.mkdtemp(prefix="numerics_spread_")]}
MODULES = {"logit_memory_pretrained": "logit_memory", "hidden_cache_draft_vocab": "hidden_cache"}  # a second --quick run of one script, with EXTRA_ARGS

NUMBER = r"(?P<value>-?\d+(?:\.\d+)?)"
VERDICT = r"\s*(?P<verdict>PASS|MISS)"
# Each goal line that prints its measured number: (pattern, whether that number meets the goal). The
# pattern's `value` is the number the verdict must follow, `goal` (when the line prints it) the bound.
GOAL_LINES = [
    (rf"harness / plain\s*: \S+\s+\(paired {NUMBER}\)\s+goal <= 1\.03{VERDICT}", lambda v, g: v <= 1.03),
    (rf"(?:peak|time)\s+<= (?P<goal>[\d.]+) x joint : {NUMBER}{VERDICT}", lambda v, g: v <= g),
    (rf"\(peak-base\)/logit_bytes within 15% \[\w+\] : {NUMBER}{VERDICT}", lambda v, g: abs(v - 1) <= 0.15),
    (rf"step time <= (?P<goal>[\d.]+) x ntp : {NUMBER}{VERDICT}", lambda v, g: v <= g),
    (rf"median <= (?P<goal>[\d.]+) s: {NUMBER} s{VERDICT}", lambda v, g: v <= g),
    (rf"every_n_steps=50: {NUMBER}% .*goal <= (?P<goal>[\d.]+)%:{VERDICT}", lambda v, g: v <= g),
    (rf"<= (?P<goal>[\d.]+) ops per round: {NUMBER}{VERDICT}", lambda v, g: v <= g),
    (rf">= (?P<goal>[\d.]+) x ntp \(\w+\) : {NUMBER}{VERDICT}", lambda v, g: v >= g),
    (rf"<= (?P<goal>[\d.]+) x live frozen step \(CPU time\): {NUMBER}{VERDICT}", lambda v, g: v <= g),
    (rf"<= (?P<goal>[\d.]+) x full vocabulary \(CPU time\): {NUMBER}{VERDICT}", lambda v, g: v <= g),
    (rf"tokens per target forward >= (?P<goal>[\d.]+) .*: {NUMBER}{VERDICT}", lambda v, g: v >= g),
    (rf"wall clock >= (?P<goal>[\d.]+)x .*: {NUMBER}{VERDICT}", lambda v, g: v >= g),
]

# Scripts whose --quick goal lines print a verdict without the number it came from (data_scale's goals
# are over a table above; decode_speed --quick has only the cached-vs-uncached goal, of a median and a
# token comparison): their structural goals are checked through STRUCTURAL.
UNNUMBERED_GOALS = {"data_scale", "decode_speed", "oracle_heads", "numerics_spread"}  # oracle_heads: a ceiling, no goal of its own


def goal_verdicts(stdout: str) -> list[str]:
    """Every goal line that prints its number, checked: its PASS/MISS is what that number gives.

    Returns the checked lines; raises AssertionError at the first verdict its number contradicts."""
    checked = []
    for line in stdout.splitlines():
        for pattern, meets in GOAL_LINES:
            found = re.search(pattern, line)
            if found is None:
                continue
            goal = float(found["goal"]) if "goal" in found.groupdict() else None
            expected = "PASS" if meets(float(found["value"]), goal) else "MISS"
            assert found["verdict"] == expected, f"verdict {found['verdict']} but its number gives {expected}: {line}"
            checked.append(line)
    return checked


def test_goal_verdicts_follow_the_printed_numbers():
    """Hand-written goal lines in the scripts' formats: a verdict that contradicts its number is caught."""
    good = ("  harness / plain         : 1.010  (paired 1.020)  goal <= 1.03  PASS\n"
            "  chunked peak    <= 0.15 x joint : 0.200  MISS\n"
            "  (peak-base)/logit_bytes within 15% [joint] : 0.900  PASS\n"
            "goal: lab-train --help median <= 1.5 s: 1.72 s MISS\n"
            "amortised overhead at every_n_steps=50: 2.10% (c/50, phase 1), +1.00% direct; goal <= 3%: PASS\n"
            "goal: parallel K=4 FLOP throughput >= 0.9 x ntp (eager) : 0.950  PASS\n"
            "a table row without a goal: 3.0 PASS")
    assert len(goal_verdicts(good)) == 6
    for wrong in ("  harness / plain         : 1.010  (paired 1.040)  goal <= 1.03  PASS",
                  "  (peak-base)/logit_bytes within 15% [sequential] : 1.200  PASS",
                  "goal at V=259, K=4: step time <= 1.05 x ntp : 1.020  MISS",
                  "goal: cached step <= 0.5 x live frozen step (CPU time): 0.700 PASS",
                  "goal: draft stage at N=512 <= 0.5 x full vocabulary (CPU time): 0.600 PASS"):
        with pytest.raises(AssertionError, match="but its number gives"):
            goal_verdicts(wrong)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_quick_run(name):
    result = subprocess.run([sys.executable, "-m", f"experiments.benchmarks.{MODULES.get(name, name)}", "--quick", *EXTRA_ARGS.get(name, [])], check=False, cwd=ROOT,
                            capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    for text in EXPECTED[name]:
        assert text in result.stdout, f"{text!r} missing from:\n{result.stdout}"
    checked = goal_verdicts(result.stdout)
    assert checked or name in UNNUMBERED_GOALS, f"no goal line with its number in:\n{result.stdout}"
    for goal in STRUCTURAL.get(name, []):
        line = next(line for line in result.stdout.splitlines() if goal in line)
        assert "PASS" in line and "MISS" not in line, line


@pytest.mark.slow
def test_decode_speed_against_peers_quick(tmp_path):
    """`decode_speed --peers` on a tiny local Llama: every harness decoder emits harness plain's tokens (a structural check)."""
    from tests.hf_fixtures import write_llama

    folder = write_llama(tmp_path / "llama")
    result = subprocess.run([sys.executable, "-m", "experiments.benchmarks.decode_speed", "--quick", "--skip-cache-part", "--peers", str(folder)],
                            check=False, cwd=ROOT, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if re.search(r"\s(code|text)\s+harness ", line)]
    assert "== peers" in result.stdout and "transformers prompt lookup" in result.stdout and len(rows) == 2 * 12, result.stdout
    assert all(re.search(r"\s(\d+)/\1$", line.rstrip()) for line in rows), result.stdout  # n/n prompts: plain's tokens everywhere


@pytest.mark.slow
def test_decode_speed_against_peers_replays_identical_text_in_bf16(tmp_path):
    """`--replay --dtype bfloat16`: every decoder, transformers' own included, writes harness plain's tokens and says
    how many slots the replay held off its argmax."""
    from tests.hf_fixtures import write_llama

    folder = write_llama(tmp_path / "llama")
    result = subprocess.run([sys.executable, "-m", "experiments.benchmarks.decode_speed", "--quick", "--skip-cache-part", "--peers", str(folder),
                             "--dtype", "bfloat16", "--replay"], check=False, cwd=ROOT, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if re.search(r"\s(code|text)\s+(harness|transformers) ", line)]
    assert "identical text" in result.stdout and len(rows) == 2 * 14, result.stdout
    assert all(re.search(r"\s(\d+)/\1; replay held \d+ of \d+ slots$", line.rstrip()) for line in rows), result.stdout


@pytest.mark.parametrize("script, option", [("oracle_heads", "--runs"), ("oracle_heads", "--prompts-from"), ("decode_speed", "--runs")])
def test_a_folder_without_a_split_is_refused_in_one_line_before_any_work(tmp_path, script, option):
    """Held-out prompts are cut from a training run's own split: a folder that is not a run (a sweep folder, a typo)
    gets one line naming the option and the folder, exit 2, and no table."""
    (tmp_path / "checkpoints").mkdir()  # looks like a run, but has no saved config to rebuild its split from
    runs = ["--runs", str(tmp_path)] if option == "--runs" else ["--runs", str(tmp_path), "--prompts-from", str(tmp_path)]
    extra = ["--skip-cache-part"] if script == "decode_speed" else []
    result = subprocess.run([sys.executable, "-m", f"experiments.benchmarks.{script}", *extra, *runs], check=False, cwd=ROOT,
                            capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"{option}: {tmp_path} is not a training run folder" in errors[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == "", result.stdout

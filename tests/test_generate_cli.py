"""`lab-generate` through the real CLI on a checkpoint of a real 20-step `lab-train` run, and on its release."""

from __future__ import annotations

import io
import re
import json
import os
import subprocess
import sys

import pytest
import torch

from lab.decode import generate
from lab.decode.cli import main as lab_generate_main
from lab.decode.loading import load_for_generation
from lab.release.export import export
from tests.cli import TINY, lab_train, read_run, SUBPROCESS_TIMEOUT

PROMPT = "def main(x):\n    return"


def lab_generate(*args: str, stdin: bytes | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lab.decode.cli", *args], input=stdin, capture_output=True, timeout=SUBPROCESS_TIMEOUT, cwd=cwd, env=dict(os.environ)
    )


def lab_generate_in_process(capsysbinary, monkeypatch, *args: str, stdin: bytes | None = None):
    """The same entry point in this process (the subprocess start costs seconds): (exit code, stdout, stderr)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = 0
    try:
        lab_generate_main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsysbinary.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, cache_dir):
    """A real 20-step lab-train run of a K=3 parallel model."""
    root = tmp_path_factory.mktemp("generate")
    run = root / "run"
    overrides = [o for o in TINY if not o.startswith("trainer.max_steps")]
    result = lab_train(*overrides, "trainer.max_steps=20", "head=parallel", "head.k=3", f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return run


def test_generate_from_checkpoint_run_dir_and_stdin(run_dir, capsysbinary, monkeypatch):
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    first = lab_generate(str(ckpt), "--prompt", PROMPT, "--max-new-tokens", "12")  # the real console entry, once
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    summary = first.stderr.decode().strip().splitlines()[-1]
    assert summary.startswith("tokens: ") and "target forwards: " in summary
    n_tokens = int(summary.split()[1])
    assert 1 <= n_tokens <= 12

    # The printed text is the tokenizer's decoding of generate()'s tokens on the loaded model.
    loaded = load_for_generation(ckpt)
    expected = generate(loaded.model, torch.tensor(loaded.tokenizer.encode(PROMPT)), 12, eos=loaded.tokenizer.eos_id)
    assert first.stdout.decode() == loaded.tokenizer.decode(expected.tokens) + "\n"
    assert n_tokens == len(expected.tokens)

    run = lambda *args, stdin=None: lab_generate_in_process(capsysbinary, monkeypatch, *args, stdin=stdin)  # noqa: E731
    code, out, _ = run(str(run_dir), "--max-new-tokens", "12", stdin=PROMPT.encode())
    assert code == 0 and out == first.stdout
    code, out, _ = run(str(run_dir), "--prompt-file", str(write(run_dir.parent / "prompt.txt", PROMPT)), "--max-new-tokens", "12")
    assert code == 0 and out == first.stdout

    code, out, err = run(str(run_dir), "--prompt", PROMPT, "--max-new-tokens", "12", "--speculative")
    assert code == 0 and out == first.stdout  # greedy speculative is exact
    assert b"tokens/forward: " in err and b"P(prefix>=j): " in err and b"same tokens as plain: yes" in err
    code, out, err = run(str(run_dir), "--prompt", PROMPT, "--max-new-tokens", "12", "--speculative", "--tree", "3,2")
    assert code == 0 and out == first.stdout  # a greedy tree is exact too
    assert b"(Fr\xc3\xa9chet)" in err and b"tree nodes/round: " in err

    sampled = [run(str(ckpt), "--prompt", PROMPT, "--temperature", "1.0", "--top-k", "20", "--seed", "3")[1] for _ in range(2)]
    assert sampled[0] == sampled[1]


def write(path, text: str):
    path.write_text(text)
    return path


def test_release_generates_the_parent_checkpoints_tokens(run_dir, tmp_path, capsysbinary, monkeypatch):
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    export(ckpt, tmp_path / "release")
    parent, release = load_for_generation(ckpt), load_for_generation(tmp_path / "release")
    assert release.source == "release" and release.model.k == 1 and release.context == parent.context == 32
    for prompt in ("import os\n", PROMPT, "class A:\n"):
        ids = torch.tensor(parent.tokenizer.encode(prompt))
        for kwargs in ({}, {"temperature": 0.8, "top_k": 30}):
            a = generate(parent.model, ids, 24, generator=torch.Generator().manual_seed(5), **kwargs)
            b = generate(release.model, ids, 24, generator=torch.Generator().manual_seed(5), **kwargs)
            assert a.tokens == b.tokens
    via_release = lab_generate_in_process(capsysbinary, monkeypatch, str(tmp_path / "release"), "--prompt", PROMPT, "--max-new-tokens", "12")
    direct = lab_generate_in_process(capsysbinary, monkeypatch, str(ckpt), "--prompt", PROMPT, "--max-new-tokens", "12")
    assert via_release[0] == 0 and via_release[1] == direct[1]


@pytest.mark.parametrize(
    "args,stdin,field",
    [
        (["--prompt", "x", "--temperature", "-1"], None, "--temperature"),
        (["--prompt-file", "/nonexistent/prompt.txt"], None, "--prompt-file"),
        ([], b"ok \xff\xfe bad", "stdin"),
        (["--prompt", "ok \udcff"], None, "--prompt"),  # an undecodable argv byte (surrogate escape)
        (["--prompt", "x" * 40], None, "prompt"),  # the run's context is data.seq_len=32
        (["--prompt", ""], None, "prompt"),
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--draft-steps", "0"], None, "draft_steps"),
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--draft-steps", "50"], None, "draft_steps: must be ≤ 2"),  # K=3: 2 extra heads
        (["--prompt", "x", "--max-new-tokens", "40", "--max-context"], None, "--max-new-tokens"),  # 1 + 40 > seq_len 32
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--tree", "2,x"], None, "--tree"),
        (["--prompt", "x", "--max-new-tokens", "4", "--tree", "2,2"], None, "--tree"),
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--tree", "2,2,2"], None, "tree"),  # K=3 drafts 2 positions
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--ngram", "2,0"], None, "--ngram: n-gram lengths must be ≥ 1"),
        (["--prompt", "x", "--max-new-tokens", "4", "--ngram", "2"], None, "--ngram: proposes drafts"),
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--ngram-draft", "3"], None, "--ngram-draft: sets up lookup drafts"),
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--ngram", "2", "--ngram-draft", "0"], None, "--ngram-draft: must be ≥ 1"),
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--ngram", "2", "--ngram-draft", "31"], None, "--ngram-draft: must be < 31"),
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--ngram", "2", "--ngram-only", "--tree", "2,2"], None, "tree: shapes"),
        # issue 54: the drafters' settings
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--confidence", "1.5"], None, "--confidence: must be a probability in (0, 1)"),
        (["--prompt", "x", "--max-new-tokens", "4", "--confidence", "0.3"], None, "--confidence: gates the drafts"),
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--suffix", "--choose", "0"], None, "--choose: must be ≥ 1"),
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--choose", "2"], None, "--choose: sets up lookup drafts"),
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--suffix", "--ngram-only", "--choose", "2"], None,
         "ngram.combine: choose picks the lookup or the draft heads"),
        (["--prompt", "x", "--max-new-tokens", "4", "--speculative", "--suffix", "--ngram-draft", "31"], None, "--ngram-draft: must be < 31"),
    ],
)
def test_bad_input_is_one_line_exit_2(run_dir, args, stdin, field, capsysbinary, monkeypatch):
    code, out, err = lab_generate_in_process(capsysbinary, monkeypatch, str(run_dir), *args, stdin=stdin)
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}"), err
    assert out == b""


def test_prompt_lookup_from_the_cli_emits_the_plain_greedy_tokens(run_dir, capsysbinary, monkeypatch):
    prompt = "x = 1\nx = 1\nx ="  # 13 byte tokens: the trained context is 32
    plain = lab_generate_in_process(capsysbinary, monkeypatch, str(run_dir), "--prompt", prompt, "--max-new-tokens", "8")
    assert plain[0] == 0 and plain[1]
    for extra in (["--ngram-only"], ["--ngram-draft", "4"]):
        code, out, err = lab_generate_in_process(capsysbinary, monkeypatch, str(run_dir), "--prompt", prompt, "--max-new-tokens", "8",
                                                 "--speculative", "--ngram", "3,2,1", *extra)
        assert code == 0 and out == plain[1], err
    for extra in (["--suffix", "--loop"], ["--suffix", "--choose", "2", "--confidence", "0.2"], ["--ngram", "2,1", "--spec-factor", "2"]):
        code, out, err = lab_generate_in_process(capsysbinary, monkeypatch, str(run_dir), "--prompt", prompt, "--max-new-tokens", "8",
                                                 "--speculative", *extra)
        assert code == 0 and out == plain[1], (extra, err)


def test_generating_past_the_trained_context_warns_in_one_line_naming_it(run_dir, capsysbinary, monkeypatch):
    code, out, err = lab_generate_in_process(capsysbinary, monkeypatch, str(run_dir), "--prompt", "x", "--max-new-tokens", "40")
    warnings = [line for line in err.decode().splitlines() if line.startswith("warning:")]
    assert code == 0 and out and len(warnings) == 1 and "data.seq_len=32" in warnings[0] and "= 41 positions" in warnings[0], err
    code, _, err = lab_generate_in_process(capsysbinary, monkeypatch, str(run_dir), "--prompt", "x", "--max-new-tokens", "31")
    assert code == 0 and b"warning" not in err  # 1 + 31 = 32 positions: within the trained context


def test_missing_model_path_is_one_line_exit_2(tmp_path, capsysbinary, monkeypatch):
    code, _, err = lab_generate_in_process(capsysbinary, monkeypatch, str(tmp_path / "nothing.ckpt"), "--prompt", "x")
    assert code == 2 and err.decode().startswith("error: checkpoint")


def test_a_real_run_logs_draft_agreement(run_dir):
    final = read_run(run_dir)["final_metrics"]
    chain = [final[f"val/agree_chain/h{k}"] for k in (2, 3)]
    assert all(0.0 <= final[f"val/agree/h{k}"] <= 1.0 for k in (2, 3)) and "val/agree/h1" not in final
    assert final["val/est_tokens_per_forward"] == pytest.approx(1 + chain[0] + chain[0] * chain[1], abs=1e-5)


def test_a_real_run_writes_its_decoding_evaluation(run_dir):
    report = json.loads((run_dir / "decoding.json").read_text())
    final = read_run(run_dir)["final_metrics"]
    plan = report["budget"]  # 4 prompts x 64 tokens x 3 repeats asked, sized to the run's training time
    assert plan["requested"] == [4, 64, 3] and plan["budget_s"] == pytest.approx(read_run(run_dir)["cost"]["fit_time_s"])
    assert report["settings"] == {"prompts": plan["prompts"], "new_tokens": plan["new_tokens"], "temperature": 1.0}  # the headline: T=1 sampling
    assert report["greedy"]["settings"]["temperature"] == 0.0
    assert final["decode/tokens_per_forward"] == pytest.approx(report["headline"]["tokens_per_forward"], rel=1e-6)
    clean = [p for p in report["prompts"] if not p["degenerate"]]
    assert final["decode/prompts_clean"] == len(clean) > 0
    emitted = sum(len(p["speculative_tokens"]) for p in report["prompts"])
    assert report["speculative"]["tokens_per_forward"] == pytest.approx(emitted / report["speculative"]["target_forwards"])
    assert {"decode/accept/p1", "decode/accept_cond/p2", "decode/mean_accept_len", "decode/speedup", "decode/greedy/greedy_match"} <= set(final)
    header = (run_dir / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "decode/tokens_per_forward" in header


def test_the_cli_prefix_probability_never_rises_with_prompt_lookup_and_speed_is_paired(run_dir, capsysbinary, monkeypatch):
    prompt = "x = 1\nx = 1\nx ="
    code, out, err = lab_generate_in_process(capsysbinary, monkeypatch, str(run_dir), "--prompt", prompt, "--max-new-tokens", "12",
                                             "--speculative", "--ngram", "3,2,1", "--pairs", "2")
    assert code == 0, err
    lines = err.decode().splitlines()
    reach = [float(x) for x in re.search(r"P\(prefix>=j\): \[([^\]]*)\]", err.decode()).group(1).split(",")]
    assert all(a >= b for a, b in zip(reach, reach[1:])), reach  # per-position rates of rounds drafting j may rise; this may not
    speed = next(line for line in lines if line.startswith("speed vs plain: "))
    assert "of 2 paired runs" in speed and "same tokens as plain: yes" in speed  # float32 greedy: exact
    assert re.search(r"tokens/s: [\d.]+ \(wall\), [\d.]+ \(worker CPU\)", lines[0] if lines[0].startswith("tokens:") else err.decode())

"""`lab-eval RUN --task humaneval`: complete HumanEval's prompts with the run's model, run each completion and its
tests in the sandbox, and record pass@1 / pass@k.

Completions come from the harness's own decoder (plain, or `--speculative`: exact, so pass@k is the same
and the speed and acceptance on these prompts come for free). Greedy (`--temperature 0`, the default)
gives pass@1 from one completion per problem; `--samples n --temperature T --k 1,10` gives the unbiased
pass@k over n samples. Writes `<run>/eval/humaneval.jsonl` (per problem: completions, verdicts,
reasons) and `<run>/eval/humaneval.json` (the summary), and adds the summary to run.json
(`eval.humaneval`, and `eval/humaneval/pass@k` among its final metrics, so runs.csv and the sweep
report carry it). A toy model's 0.0 is an answer: it says the model cannot write these functions.

Bad input (an unknown task, `k` larger than n, a tokenizer that cannot encode the prompts) ends with one
line `error: ...`, exit 2, and nothing written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lab.errors import ConfigError

TASKS = ("humaneval",)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lab-eval", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="run directory, checkpoint or release folder (as lab-generate takes)")
    parser.add_argument("--task", default="humaneval", help=f"one of: {', '.join(TASKS)}")
    parser.add_argument("--samples", type=int, default=1, help="completions per problem (n)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--k", default="1", help="comma-separated k of pass@k, each ≤ --samples")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--speculative", action="store_true", help="decode with the run's heads (exact: same completions)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wall-s", type=float, default=10.0, help="sandbox wall-clock limit per program")
    return parser.parse_args(argv)


def check_args(args) -> list[int]:
    if args.task not in TASKS:
        raise ConfigError("--task", f"unknown {args.task!r}; allowed: {', '.join(TASKS)}")
    if args.samples < 1:
        raise ConfigError("--samples", f"must be ≥ 1, got {args.samples}")
    try:
        ks = sorted({int(k) for k in args.k.split(",")})
    except ValueError:
        raise ConfigError("--k", f"must be comma-separated integers (e.g. 1,10), got {args.k!r}") from None
    if ks[0] < 1 or ks[-1] > args.samples:
        raise ConfigError("--k", f"each k must be in [1, --samples={args.samples}] (pass@k needs n ≥ k samples), got {args.k}")
    if args.temperature < 0:
        raise ConfigError("--temperature", f"must be ≥ 0, got {args.temperature}")
    if args.temperature == 0 and args.samples > 1:
        raise ConfigError("--samples", "greedy decoding (--temperature 0) writes one completion; sample with --temperature > 0")
    return ks


def encode_prompts(tokenizer, problems) -> list[list[int]]:
    """Every prompt's ids; refused when the tokenizer cannot encode a prompt exactly (it would decode to other text)."""
    encoded = []
    for problem in problems:
        ids = tokenizer.encode(problem.prompt)
        if tokenizer.decode(ids) != problem.prompt:
            raise ConfigError("--task", f"the run's tokenizer cannot encode {problem.task_id}'s prompt exactly "
                                        "(it decodes to other text); evaluate a run whose tokenizer covers the prompts")
        encoded.append(ids)
    return encoded


def run(args) -> dict:
    import torch

    from lab.decode.generate import generate
    from lab.decode.loading import load_for_generation
    from lab.eval.humaneval import load_problems, pass_at_k, program, truncate
    from lab.eval.sandbox import Limits, run_sandboxed

    ks = check_args(args)
    problems = load_problems(args.limit)
    loaded = load_for_generation(args.model)
    prompts = encode_prompts(loaded.tokenizer, problems)
    if args.speculative and loaded.proposer_refusal:
        raise ConfigError("--speculative", loaded.proposer_refusal)
    limits = Limits(wall_s=args.wall_s)
    rows, tokens, forwards, decode_s, begin = [], 0, 0, 0.0, time.perf_counter()
    for index, (problem, ids) in enumerate(zip(problems, prompts)):
        completions, verdicts = [], []
        for sample in range(args.samples):
            generator = torch.Generator().manual_seed(args.seed * 100_003 + index * 1_009 + sample)
            start = time.perf_counter()
            out = generate(loaded.model, torch.tensor(ids), args.max_new_tokens, temperature=args.temperature,
                           speculative=args.speculative, eos=loaded.tokenizer.eos_id, generator=generator)
            decode_s += time.perf_counter() - start
            tokens, forwards = tokens + out.stats["emitted"], forwards + out.stats["target_forwards"]
            completion = truncate(loaded.tokenizer.decode(out.tokens))
            completions.append(completion)
            verdicts.append(run_sandboxed(program(problem, completion), limits))
        correct = sum(v.passed for v in verdicts)
        rows.append({"task_id": problem.task_id, "n": args.samples, "correct": correct, "completions": completions,
                     "passed": [v.passed for v in verdicts], "reasons": [v.reason for v in verdicts]})
        print(f"{problem.task_id}: {correct}/{args.samples} passed ({verdicts[0].reason})", file=sys.stderr, flush=True)
    summary = {
        "task": args.task, "problems": len(problems), "samples": args.samples, "temperature": args.temperature,
        "speculative": args.speculative, "max_new_tokens": args.max_new_tokens,
        **{f"pass@{k}": sum(pass_at_k(r["n"], r["correct"], k) for r in rows) / len(rows) for k in ks},
        "tokens_per_forward": tokens / forwards if forwards else None, "decode_tokens_per_s": tokens / decode_s if decode_s else None,
        "seconds": time.perf_counter() - begin,
    }
    write_results(Path(args.model), rows, summary)
    return summary


def write_results(model_path: Path, rows: list[dict], summary: dict) -> None:
    """<run>/eval/humaneval.jsonl and .json; the summary into run.json when the model is a run directory."""
    from lab.report.atomic import write_text_atomic

    run_dir = model_path if model_path.is_dir() else model_path.parent.parent  # a run's checkpoints/last.ckpt
    out = run_dir / "eval"
    out.mkdir(exist_ok=True)
    write_text_atomic(out / "humaneval.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    write_text_atomic(out / "humaneval.json", json.dumps(summary, indent=2) + "\n")
    record = run_dir / "run.json"
    if record.is_file():
        payload = json.loads(record.read_text())
        payload.setdefault("eval", {})[summary["task"]] = summary
        metrics = payload.setdefault("final_metrics", {})
        metrics.update({f"eval/{summary['task']}/{name}": value for name, value in summary.items() if name.startswith("pass@")})
        write_text_atomic(record, json.dumps(payload, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        summary = run(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    shown = "  ".join(f"{name}: {value:.3f}" for name, value in summary.items() if name.startswith("pass@"))
    print(f"{summary['task']}: {summary['problems']} problems  {shown}  tokens/forward: {summary['tokens_per_forward']:.2f}  "
          f"{summary['seconds']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()

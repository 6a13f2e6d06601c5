"""`lab-eval RUN --task humaneval` (or `lab-eval --model smollm2` for a bare pretrained base): complete
HumanEval's prompts with the model, run each completion and its tests in the sandbox, and record pass@1 / pass@k.

Completions come from the harness's own decoder (plain, or `--speculative`: exact, so pass@k is the same
and the speed and acceptance on these prompts come for free; `--paired` also decodes plainly, back to back,
and counts differing completions). Greedy (`--temperature 0`, the default) gives pass@1 from one completion
per problem; `--samples n --temperature T --k 1,10` gives the unbiased pass@k over n samples. Writes
`<run>/eval/humaneval.jsonl` (per problem: completions, verdicts, reasons) and `<run>/eval/humaneval.json`
(the summary), and adds the summary to run.json (`eval.humaneval`, and `eval/humaneval/pass@k` among its
final metrics, so runs.csv and the sweep report carry it). A bare base writes to `--out` (default
`outputs/eval/<name>`). A toy model's 0.0 is an answer: it says the model cannot write these functions.

Bad input (an unknown task, `k` larger than n, a tokenizer that cannot encode the prompts) ends with one
line `error: ...`, exit 2, and nothing written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.errors import ConfigError
from lab.eval.evaluate import TASKS, EvalSettings, check_settings, evaluate, final_metrics


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="lab-eval", description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", help="run directory, checkpoint or release folder (as lab-generate takes)")
    parser.add_argument("--model", help="instead of a run: a pretrained base of the model config group (e.g. smollm2), head ntp")
    parser.add_argument("--out", type=Path, help="where a bare base's results go (default outputs/eval/<name>)")
    parser.add_argument("--task", default="humaneval", help=f"one of: {', '.join(TASKS)}")
    parser.add_argument("--samples", type=int, default=1, help="completions per problem (n)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    parser.add_argument("--k", default="1", help="comma-separated k of pass@k, each ≤ --samples")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--limit", type=int, default=None, help="only the first N problems")
    parser.add_argument("--speculative", action="store_true", help="decode with the run's heads (exact: same completions)")
    parser.add_argument("--paired", action="store_true", help="with --speculative, greedy: also decode plainly (both pass@1, speedup)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--wall-s", type=float, default=10.0, help="sandbox wall-clock limit per program")
    return parser.parse_args(argv)


def settings_of(args) -> EvalSettings:
    try:
        ks = tuple(sorted({int(k) for k in args.k.split(",")}))
    except ValueError:
        raise ConfigError("--k", f"must be comma-separated integers (e.g. 1,10), got {args.k!r}") from None
    settings = EvalSettings(args.task, args.samples, args.temperature, ks, args.max_new_tokens, args.limit, args.speculative,
                            args.paired, args.seed, args.wall_s)
    check_settings(settings)
    if (args.run is None) == (args.model is None):
        raise ConfigError("--model", "give either a run (directory, checkpoint or release folder) or --model NAME, not both or neither")
    if args.model is not None and args.speculative:
        raise ConfigError("--speculative", "a bare base has no draft heads; evaluate a run with heads")
    return settings


def load(args):
    """(model, tokenizer, results folder, run.json or None)."""
    if args.model is not None:
        from lab.run.pretrained_base import load_base

        model, tokenizer = load_base(args.model)
        return model, tokenizer, args.out or Path("outputs") / "eval" / args.model, None
    from lab.decode.loading import load_for_generation

    loaded = load_for_generation(args.run)
    if args.speculative and loaded.proposer_refusal:
        raise ConfigError("--speculative", loaded.proposer_refusal)
    path = Path(args.run)
    run_dir = path if path.is_dir() else path.parent.parent  # a run's checkpoints/last.ckpt
    record = run_dir / "run.json"
    return loaded.model, loaded.tokenizer, run_dir / "eval", record if record.is_file() else None


def write_results(out: Path, record: Path | None, rows: list[dict], summary: dict) -> None:
    """<out>/<task>.jsonl and .json; the summary into run.json when there is one."""
    from lab.report.atomic import write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / f"{summary['task']}.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    write_text_atomic(out / f"{summary['task']}.json", json.dumps(summary, indent=2) + "\n")
    if record is not None:
        payload = json.loads(record.read_text())
        payload.setdefault("eval", {})[summary["task"]] = summary
        payload.setdefault("final_metrics", {}).update(final_metrics(summary))
        write_text_atomic(record, json.dumps(payload, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        settings = settings_of(args)
        model, tokenizer, out, record = load(args)
        rows, summary = evaluate(model, tokenizer, settings)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    write_results(out, record, rows, summary)
    shown = "  ".join(f"{name}: {value:.3f}" for name, value in summary.items() if "pass@" in name)
    speed = f"  tokens/forward: {summary['tokens_per_forward']:.2f}  {summary['decode_tokens_per_s']:.1f} tokens/s"
    paired = f"  speedup {summary['speedup_median']:.2f}×, {summary['differing_completions']} differing" if settings.paired else ""
    print(f"{summary['task']}: {summary['problems']} problems  {shown}{speed}{paired}  {summary['seconds']:.0f} s "
          f"(decoding {summary['decode_s']:.0f} s, {summary['decode_cpu_s']:.0f} CPU s; sandbox {summary['sandbox_s']:.0f} s) → {out}",
          file=sys.stderr)


if __name__ == "__main__":
    main()

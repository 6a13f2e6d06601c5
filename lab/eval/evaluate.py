"""One HumanEval evaluation of a model: completions by the harness's decoder, each run with its tests in the
sandbox, pass@k over the problems, and the decoding speed on these prompts.

Shared by `lab-eval` (a run, a release or a bare base) and the end-of-run callback
(lab/callbacks/humaneval.py). Greedy (`temperature=0`) writes one completion per problem; sampling
writes n per problem, decoded as one batch of n rows of the same prompt (each row with its own
generator, so its tokens equal a single request's with that generator). A request ends at EOS, at
its token budget, or once its text holds a stop sequence (the completion is cut there anyway).
`paired` (greedy and speculative): each prompt is also decoded plainly, back to back, so the summary
holds both pass@1 values, how many completions differ (bf16 near-ties; none in float32) and the
median speedup on these prompts.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

from lab.errors import ConfigError

TASKS = ("humaneval",)


@dataclass(frozen=True)
class EvalSettings:
    task: str = "humaneval"
    samples: int = 1  # completions per problem (n)
    temperature: float = 0.0  # 0 = greedy
    ks: tuple[int, ...] = (1,)  # the k of pass@k, each ≤ samples
    max_new_tokens: int = 256
    limit: int | None = None  # only the first `limit` problems
    speculative: bool = False  # decode with the model's heads (exact: the same completions)
    paired: bool = False  # greedy speculative: also decode plainly, back to back (both pass@1, differing completions, speedup)
    seed: int = 0
    wall_s: float = 10.0  # sandbox wall-clock limit per program


def check_settings(settings: EvalSettings, prefix: str = "--") -> None:
    """One line naming the setting (`--k` on the CLI, `callbacks.humaneval.k` in a run's config) for each bad value."""
    name = lambda field: f"{prefix}{field.replace('_', '-') if prefix == '--' else field}"  # noqa: E731
    if settings.task not in TASKS:
        raise ConfigError(name("task"), f"unknown {settings.task!r}; allowed: {', '.join(TASKS)}")
    if settings.samples < 1:
        raise ConfigError(name("samples"), f"must be ≥ 1, got {settings.samples}")
    if not settings.ks or min(settings.ks) < 1 or max(settings.ks) > settings.samples:
        raise ConfigError(name("k"), f"each k must be in [1, {name('samples')}={settings.samples}] (pass@k needs n ≥ k samples), "
                                     f"got {','.join(map(str, settings.ks))}")
    if settings.temperature < 0:
        raise ConfigError(name("temperature"), f"must be ≥ 0, got {settings.temperature}")
    if settings.temperature == 0 and settings.samples > 1:
        raise ConfigError(name("samples"), f"greedy decoding ({name('temperature')} 0) writes one completion; sample with a temperature > 0")
    if settings.temperature == 0 and settings.seed != EvalSettings.seed:
        raise ConfigError(name("seed"), f"greedy decoding ({name('temperature')} 0) draws nothing, so a seed changes nothing; "
                                        f"sample with a temperature > 0 or leave the seed at {EvalSettings.seed}")
    if settings.paired and not (settings.speculative and settings.temperature == 0):
        raise ConfigError(name("paired"), "compares speculative with plain greedy completions: it needs speculative and temperature 0")
    if settings.max_new_tokens < 1:
        raise ConfigError(name("max_new_tokens"), f"must be ≥ 1, got {settings.max_new_tokens}")
    if settings.limit is not None and settings.limit < 1:
        raise ConfigError(name("limit"), f"must be ≥ 1 (or left out for all problems), got {settings.limit}")


def encode_prompts(tokenizer, problems) -> list[list[int]]:
    """Every prompt's ids; refused when the tokenizer cannot encode a prompt exactly (it would decode to other text)."""
    encoded = []
    for problem in problems:
        try:
            ids = tokenizer.encode(problem.prompt)
        except ConfigError:  # a symbol tokenizer (synthetic tasks) knows none of Python's characters
            ids = None
        if ids is None or tokenizer.decode(ids) != problem.prompt:
            raise ConfigError("tokenizer", f"the model's tokenizer cannot encode {problem.task_id}'s prompt exactly "
                                           "(it decodes to other text); evaluate a model whose tokenizer covers the prompts")
        encoded.append(ids)
    return encoded


def prompt_ids(tokenizer, count: int | None = None) -> list[list[int]]:
    """The first `count` HumanEval prompts as token ids (a prompt set for the decoding benchmarks)."""
    from lab.eval.humaneval import load_problems

    return encode_prompts(tokenizer, load_problems(count))


def stop_at_sequences(tokenizer):
    """`stop(tokens) -> bool`: True once the decoded text holds one of the convention's stop sequences."""
    from lab.eval.humaneval import truncate

    def stop(tokens: list[int]) -> bool:
        text = tokenizer.decode(tokens)
        return truncate(text) != text

    return stop


class Meter:
    """Decoding totals: emitted tokens, target forwards, wall and process CPU seconds."""

    def __init__(self):
        self.tokens = self.forwards = 0
        self.wall_s = self.cpu_s = 0.0

    def measure(self, decode):
        wall, cpu = time.perf_counter(), time.process_time()
        generations = decode()
        self.wall_s += time.perf_counter() - wall
        self.cpu_s += time.process_time() - cpu
        for generation in generations:
            self.tokens += generation.stats["emitted"]
            # a row of a plain batch needs one forward per token it keeps (the batch's forwards are shared by its rows)
            batched = "batch_size" in generation.stats
            self.forwards += generation.stats["emitted"] if batched else generation.stats["target_forwards"]
        return generations

    def summary(self, prefix: str = "") -> dict:
        return {f"{prefix}tokens_per_forward": self.tokens / self.forwards if self.forwards else None,
                f"{prefix}decode_tokens_per_s": self.tokens / self.wall_s if self.wall_s else None,
                f"{prefix}decode_s": self.wall_s, f"{prefix}decode_cpu_s": self.cpu_s}


def complete(model, ids: list[int], settings: EvalSettings, index: int, stop, eos, speculative: bool) -> list:
    """The problem's n generations: one greedy request, or n sampled rows of the prompt (batched when plain)."""
    from lab.decode.generate import generate

    seeds = [settings.seed * 100_003 + index * 1_009 + sample for sample in range(settings.samples)]
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    prompt = torch.tensor(ids)
    if settings.samples > 1 and not speculative:
        return generate(model, [prompt] * settings.samples, settings.max_new_tokens, temperature=settings.temperature, eos=eos,
                        generator=generators, stop=stop)
    return [generate(model, prompt, settings.max_new_tokens, temperature=settings.temperature, speculative=speculative, eos=eos,
                     generator=generator, stop=stop) for generator in generators]


def evaluate(model, tokenizer, settings: EvalSettings, log=None) -> tuple[list[dict], dict]:
    """(per-problem rows, summary) of `settings.task` on `model`."""
    from lab.eval.humaneval import load_problems, pass_at_k, program, truncate
    from lab.eval.sandbox import Limits, run_sandboxed

    check_settings(settings)
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    problems = load_problems(settings.limit)
    prompts = encode_prompts(tokenizer, problems)
    stop, eos, limits = stop_at_sequences(tokenizer), tokenizer.eos_id, Limits(wall_s=settings.wall_s)
    meter, plain_meter, speedups = Meter(), Meter(), []
    rows, sandbox_s, begin, networks = [], 0.0, time.perf_counter(), set()
    model.eval()
    for index, (problem, ids) in enumerate(zip(problems, prompts)):
        generations = meter.measure(lambda: complete(model, ids, settings, index, stop, eos, settings.speculative))
        completions = [truncate(tokenizer.decode(g.tokens)) for g in generations]
        start = time.perf_counter()
        verdicts = [run_sandboxed(program(problem, c), limits) for c in completions]
        sandbox_s += time.perf_counter() - start
        networks.update(v.network for v in verdicts)  # "isolated", or "shared: why" where the kernel refused a namespace
        row = {"task_id": problem.task_id, "n": settings.samples, "correct": sum(v.passed for v in verdicts), "completions": completions,
               "passed": [v.passed for v in verdicts], "reasons": [v.reason for v in verdicts]}
        if settings.paired:
            row |= paired_row(model, tokenizer, problem, ids, settings, index, stop, eos, generations[0], plain_meter, limits)
            speedups.append(row["speedup"])
        rows.append(row)
        log(f"{problem.task_id}: {row['correct']}/{settings.samples} passed ({verdicts[0].reason})")
    summary = {**asdict(settings), "ks": list(settings.ks), "problems": len(problems),
               **{f"pass@{k}": sum(pass_at_k(r["n"], r["correct"], k) for r in rows) / len(rows) for k in settings.ks},
               **meter.summary(), "sandbox_s": sandbox_s, "sandbox_network": ", ".join(sorted(networks)),
               "seconds": time.perf_counter() - begin}
    if settings.paired:
        summary |= {"plain_pass@1": sum(r["plain_passed"] for r in rows) / len(rows),
                    "differing_completions": sum(r["plain_completion"] != r["completions"][0] for r in rows),
                    "speedup_median": statistics.median(speedups), **plain_meter.summary("plain_")}
    return rows, summary


def paired_row(model, tokenizer, problem, ids, settings, index, stop, eos, speculative_generation, plain_meter, limits) -> dict:
    """The plain greedy completion of the same prompt, decoded right after the speculative one, and its verdict."""
    from lab.eval.humaneval import program, truncate
    from lab.eval.sandbox import run_sandboxed

    plain = plain_meter.measure(lambda: complete(model, ids, settings, index, stop, eos, speculative=False))[0]
    completion = truncate(tokenizer.decode(plain.tokens))
    per_token = lambda g: g.stats["total_time_s"] / max(1, g.stats["emitted"])  # noqa: E731
    return {"plain_completion": completion, "plain_passed": run_sandboxed(program(problem, completion), limits).passed,
            "speedup": per_token(plain) / per_token(speculative_generation)}


def final_metrics(summary: dict) -> dict[str, float]:
    """What run.json's final metrics (and so runs.csv and the sweep report) carry of a summary."""
    names = [name for name in summary if name.startswith("pass@") or name == "plain_pass@1"]
    names += [name for name in ("tokens_per_forward", "decode_tokens_per_s", "speedup_median", "differing_completions", "problems")
              if summary.get(name) is not None]
    return {f"eval/{summary['task']}/{name}": float(summary[name]) for name in names}

"""Trained independent heads against the marginal oracle: how much of the reachable acceptance they have.

For each run with independent heads (Medusa, linear …; on a transformers trunk whose next-token path is its own), on the
run's own held-out prompts at one temperature: the heads' chain (lab.decode, speculative) and the
oracle's chain (experiments.benchmarks.marginal_oracle: drafts from the target's exact-in-expectation marginals, the law
perfectly trained heads would have) with as many draft positions. Prints tokens per target forward,
acceptance by position in both conventions, and the heads' share of the oracle's extra tokens,
(heads − 1) / (oracle − 1). Acceptance is not a timing: the numbers do not depend on the machine's load.

    python -m experiments.benchmarks.oracle_heads --runs RUN_DIR ... [--prompts 8 --new-tokens 48 --paths 32 --temperature 1]
    python -m experiments.benchmarks.oracle_heads --runs A B --prompts-from A   # both on A's held-out prompts
    python -m experiments.benchmarks.oracle_heads --quick      # a random tiny Llama with Medusa heads, seconds
"""

from __future__ import annotations

from experiments.benchmarks.common import table  # isort: skip  (sets the OpenMP wait policy before torch loads)

import argparse
from pathlib import Path

import torch

from lab.decode import generate
from experiments.benchmarks.marginal_oracle import oracle_decode
from lab.decode_core.ledger import acceptance_conventions, ledger, merge
from lab.decode_core.sampling import TokenChooser
from lab.model.heads.independent_drafter import IndependentHeads


def heads_chain(model, prompts: list[list[int]], new_tokens: int, temperature: float) -> dict:
    runs = [generate(model, torch.tensor(p), new_tokens, temperature=temperature, speculative=True,
                     generator=torch.Generator().manual_seed(1000 + i)).stats for i, p in enumerate(prompts)]
    return ledger(merge(runs))


def oracle_chain(model, prompts: list[list[int]], new_tokens: int, temperature: float, depth: int, paths: int) -> dict:
    outs = [oracle_decode(model, p, new_tokens, depth, paths, TokenChooser(temperature, None, torch.Generator().manual_seed(2000 + i)))
            for i, p in enumerate(prompts)]
    tokens, forwards = sum(len(o["tokens"]) for o in outs), sum(o["target_forwards"] for o in outs)
    rounds = lambda key: [n for o in outs for n in o[key]]  # noqa: E731  (pooled over prompts, as lab.decode_core.ledger.merge does)
    return {"tokens_per_forward": tokens / forwards, **acceptance_conventions(rounds("proposed_by_round"), rounds("accepted_by_round"), depth)}


class OracleMemo:
    """One oracle measurement per prompt set and settings while the runs share their base bit for bit (head-only runs
    of one model): the oracle reads the base only, so a second run on the same base would repeat the same numbers."""

    def __init__(self):
        self.base, self.results = None, {}

    def __call__(self, model, prompts, new_tokens: int, temperature: float, depth: int, paths: int) -> dict:
        base = model.hf_model.state_dict()
        if self.base is None or self.base.keys() != base.keys() or not all(torch.equal(self.base[k], base[k]) for k in base):
            self.base, self.results = base, {}
        key = (tuple(map(tuple, prompts)), new_tokens, temperature, depth, paths)
        if key not in self.results:
            self.results[key] = oracle_chain(model, prompts, new_tokens, temperature, depth, paths)
        return self.results[key]


ORACLE = OracleMemo()


def row(name: str, model, prompts, args) -> list | None:
    if model.head.drafter is not IndependentHeads:
        print(f"{name}: skipped: {model.head_cfg.name}'s drafts see the frontier token, so the marginal is not their ceiling")
        return None
    heads = heads_chain(model, prompts, args.new_tokens, args.temperature)
    depth = len(heads["accept_by_position"])
    oracle = ORACLE(model, prompts, args.new_tokens, args.temperature, depth, args.paths)
    share = (heads["tokens_per_forward"] - 1) / (oracle["tokens_per_forward"] - 1)
    cells = lambda values: ",".join(f"{v:.2f}" for v in values)  # noqa: E731
    return [name, f"{model.head_cfg.name} K={model.k}", depth, f"{heads['tokens_per_forward']:.3f}", cells(heads["accept_by_position"]),
            cells(heads["accept_cond_by_position"]), f"{oracle['tokens_per_forward']:.3f}", cells(oracle["accept_by_position"]),
            cells(oracle["accept_cond_by_position"]), f"{share:.2f}"]


def quick_model():
    from lab.model.mtp import build_model

    torch.manual_seed(0)
    config = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "initializer_range": 0.2}
    return build_model({"name": "hf", "config": config}, {"name": "medusa", "k": 3, "trunk_grad": "frozen", "compute_match": "none"}).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="*", type=Path, default=[])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--prompt-set", default="heldout", choices=["heldout", "humaneval"],
                        help="the runs' held-out documents (cut to --prompt-tokens) or HumanEval's prompts (whole)")
    parser.add_argument("--paths", type=int, default=32, help="sampled continuations per oracle round (the marginals' estimate)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--prompts-from", type=Path, default=None,
                        help="a run whose held-out prompts every run is measured on (default: each run's own)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    from experiments.benchmarks.decode_speed import refuse_runs_without_split

    refuse_runs_without_split(parser, "--prompts-from" if args.prompts_from else "--runs",
                              [args.prompts_from] if args.prompts_from else args.runs, args.prompt_set)
    header = ["run", "head", "drafts", "heads tok/fwd", "heads P(prefix>=j)", "heads P(j|<j)", "oracle tok/fwd",
              "oracle P(prefix>=j)", "oracle P(j|<j)", "heads' share"]
    rows: list[list | None] = []
    if args.quick:
        args.new_tokens, args.paths = 12, 4
        prompts = [[1, 2, 3, 4, 5], [7, 7, 8, 9]]
        rows.append(row("random tiny Llama", quick_model(), prompts, args))
    for run_dir in args.runs:
        from experiments.benchmarks.decode_speed import run_prompts
        from lab.decode.loading import load_for_generation

        prompts = run_prompts(args.prompts_from or run_dir, args.prompts, args.prompt_tokens, args.prompt_set)
        name = f"{run_dir.parent.name}/{run_dir.name}"  # a sweep's jobs share names across sweeps
        rows.append(row(name, load_for_generation(run_dir).model.eval(), prompts, args))
    print(f"== independent heads vs the marginal oracle, T={args.temperature}, {args.new_tokens} new tokens, {args.paths} paths per oracle round")
    print(table(header, [r for r in rows if r is not None]))
    print("heads' share = (heads tokens/forward - 1) / (oracle tokens/forward - 1): the part of the reachable extra tokens the heads reach")


if __name__ == "__main__":
    main()

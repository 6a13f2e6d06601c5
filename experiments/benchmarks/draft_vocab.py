"""What a draft vocabulary saves per decoding round: the draft heads' projection and a whole speculative round.

On one model (a local Hugging Face folder, Medusa K heads, shared lm_head; heads untrained: the cost of a
round does not depend on what they learned), the same round's pieces with the full vocabulary and with
draft vocabularies of N ids, interleaved in rotated order, timed by per-thread CPU time (torch on one
thread): the draft stage of one round (the K−1 Medusa blocks + every horizon's projection in one call,
`IndependentHeads.draft_logits`), and a greedy speculative `generate` of `--tokens` tokens per call, as
ms per target forward. The N ids are the most frequent of the model's tokenizer over Python
standard-library modules (experiments/benchmarks/hidden_cache.py `stdlib_rows`); which ids they are does
not change the cost.

    python -m experiments.benchmarks.draft_vocab --model /work/models/smollm2-135m-hf --sizes 4096,8192
    python -m experiments.benchmarks.draft_vocab --quick      # a tiny Llama config, seconds
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import interleave, paired_ratio, table, verdict  # isort: skip

import argparse
import time

import torch

from experiments.benchmarks.hidden_cache import TINY_LLAMA, stdlib_rows, zipf_rows
from lab.decode import generate
from lab.decode_core.target import CachedModel
from lab.nn.draft_vocab import most_frequent_ids, training_token_counts
from lab.model.heads.independent_drafter import IndependentHeads
from lab.model.mtp import build_model

GOAL = 0.5  # the smallest draft vocabulary's draft stage, as a share of the full vocabulary's


def draft_stage(model, rows: torch.Tensor):
    """f(): one round's draft work at one position: Medusa blocks on the frontier's trunk row, then every projection."""
    proposer = IndependentHeads(CachedModel(model), None)  # slices the projections for the current draft ids once

    def run():
        with torch.no_grad():
            rest = model.head.horizon_rows(rows, None)  # horizon 1, then the Medusa blocks' rows
            next(rest)
            draft_rows = proposer.drafter(rows, rest, None)  # [K-1, 1, d]
            proposer.draft_logits(draft_rows[:, -1])  # [K-1, V]

    return run


def decode(model, prompt: torch.Tensor, tokens: int, seconds_per_forward: list):
    def run():
        out = generate(model, prompt, tokens, speculative=True)
        seconds_per_forward.append(out.stats["target_forwards"])

    return run


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="a local Hugging Face model folder (default: a tiny Llama config, V=49152)")
    parser.add_argument("--sizes", default="4096,8192", help="draft vocabulary sizes N, comma-separated")
    parser.add_argument("--k", type=int, default=5, help="Medusa K (K-1 draft heads)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per speculative generate call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    llama = {**TINY_LLAMA, "num_hidden_layers": 2} if args.quick else TINY_LLAMA
    model_cfg = {"name": "hf", **({"path": args.model} if args.model else {"config": llama})}
    sizes = [int(n) for n in args.sizes.split(",")]
    model = build_model(model_cfg, {"name": "medusa", "k": args.k, "compute_match": "none"}).eval()
    vocab = model.trunk.unembedding.shape[0]
    rows, what = stdlib_rows(args.model, 128, 200) if args.model else (zipf_rows(vocab, 128, 64), "Zipf tokens")
    counts = training_token_counts(rows, vocab)
    order = most_frequent_ids(counts, vocab)
    prompt = rows[0]["tokens"][:48]
    trunk_row = torch.randn(1, 1, model.trunk.cfg.d_model)  # [1, 1, d]: the frontier's trunk state
    choices = {"full": None, **{f"N={n}": order[:n] for n in sizes}}
    stage, rounds = {}, {}
    forwards: dict[str, list] = {}
    for name, ids in choices.items():  # build each variant's proposer under its own ids
        model.set_draft_ids(ids)
        stage[f"draft stage, {name}"] = draft_stage(model, trunk_row)
        forwards[name] = []
    model.set_draft_ids(None)

    def with_ids(ids, fn):
        def run():
            model.set_draft_ids(ids)
            fn()
        return run

    for name, ids in choices.items():
        rounds[f"speculative decode, {name}"] = with_ids(ids, decode(model, prompt, args.tokens, forwards[name]))
    started = time.perf_counter()
    cpu = interleave({**stage, **rounds}, repeats=args.repeats, warmup=1, clock=time.thread_time)
    cover = {name: float(counts[ids].sum()) / float(counts.sum()) for name, ids in choices.items() if ids is not None}
    print(f"draft_vocab: {args.model or 'tiny Llama config'} V={vocab}, d {model.trunk.cfg.d_model}, Medusa K={args.k} (shared lm_head, "
          f"untrained); ids from {what}; {args.repeats} interleaved repeats after 1 warm-up, 1 thread; {time.perf_counter() - started:.0f} s")
    print("coverage of those tokens: " + ", ".join(f"{name} {share:.1%}" for name, share in cover.items()))
    full_stage, full_round = cpu["draft stage, full"], cpu["speculative decode, full"]
    out = []
    for name in choices:
        s, r = cpu[f"draft stage, {name}"], cpu[f"speculative decode, {name}"]
        per_forward = r.median / (sum(forwards[name]) / len(forwards[name])) * 1e3
        out.append([name, s.ms(), paired_ratio(s, full_stage).describe(), f"{per_forward:.1f}", paired_ratio(r, full_round).describe()])
    print(table(["draft vocabulary", "draft stage ms [IQR]", "/ full", "decode ms per target forward", "decode / full"], out))
    smallest = min(sizes)
    ratio = paired_ratio(cpu[f"draft stage, N={smallest}"], full_stage).median
    print(f"goal: draft stage at N={smallest} <= {GOAL} x full vocabulary (CPU time): {ratio:.3f} {verdict(ratio <= GOAL)}")


if __name__ == "__main__":
    main()

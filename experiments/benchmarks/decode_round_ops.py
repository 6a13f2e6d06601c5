"""Operator launches per decoding round, by stage: load-independent evidence for round overhead.

At batch 1 on a CPU a cached block costs its operator launches more than its FLOPs, so the
number of aten operations a round dispatches (counted with a `TorchDispatchMode`) is a cost
measure that a busy machine cannot blur. Stages: the target pass (trunk and next-token head
blocks over the frontier and the drafts), the draft blocks (proposer.after_verify: the batched
draft stacks, their projection, the draft caches' commit), the proposal (candidate choice),
acceptance, and everything else. Per round = the difference between two `generate` calls of
different lengths divided by the difference in rounds (prefill cancels out).

    python -m experiments.benchmarks.decode_round_ops                 # parallel K=4, compute_match=blocks
    python -m experiments.benchmarks.decode_round_ops --head linear --layers 8
    python -m experiments.benchmarks.decode_round_ops --quick          # 5 layers, seconds
    python -m experiments.benchmarks.decode_round_ops --hf /work/models/smollm2-135m-hf --head identity   # a transformers trunk

Goal (structural, counts do not depend on load): a greedy round's proposal and acceptance
dispatch at most 5 ops in all, whatever the number of drafts (no per-draft host work).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lab.decode_core.target as target
from lab.decode import generate
from lab.model.heads.deepseek.drafter import DeepSeekChain
from lab.model.heads.independent_drafter import IndependentHeads
from lab.model.mtp import build_model

from experiments.benchmarks.common import table, verdict  # isort: skip

decoding = sys.modules["lab.decode.generate"]  # the module (lab.decode.generate the name is the function)


class StageCounter(TorchDispatchMode):
    """Counts every dispatched aten op under the stage that is current when it runs."""

    def __init__(self):
        super().__init__()
        self.stage, self.counts = "other", collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[self.stage] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def tagged(self, owner, name: str, stage: str):
        """While active, calls of owner.name count as `stage`."""
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            previous, self.stage = self.stage, stage
            try:
                return original(*args, **kwargs)
            finally:
                self.stage = previous

        setattr(owner, name, wrapped)
        try:
            yield
        finally:
            setattr(owner, name, original)


# Where each drafter runs its draft blocks (tagged inside `propose`, so a chain's depth modules count as draft blocks)
DRAFT_BLOCK_METHODS = {IndependentHeads: "after_verify", DeepSeekChain: "_run"}


def stages(model) -> tuple:
    """(owner, method, stage) triples; the head's own drafter class says where its draft blocks run."""
    drafter = model.head.drafter
    return ((target.CachedModel, "forward", "target pass"), (drafter, "propose", "proposal"),
            (drafter, DRAFT_BLOCK_METHODS[drafter], "draft blocks"), (decoding, "accept_tree", "acceptance"))


def ops_per_round(model, prompt, temperature: float, speculative: bool) -> dict:
    counter = StageCounter()
    totals = []
    with contextlib.ExitStack() as stack:
        for owner, name, stage in stages(model):
            stack.enter_context(counter.tagged(owner, name, stage))
        for new_tokens in (17, 33):
            counter.counts.clear()
            with torch.no_grad(), counter:
                out = generate(model, prompt, new_tokens, temperature=temperature, speculative=speculative,
                               generator=torch.Generator().manual_seed(0))
            totals.append((dict(counter.counts), out.stats["rounds"]))
    (short, rounds_short), (long, rounds_long) = totals
    return {stage: (long.get(stage, 0) - short.get(stage, 0)) / (rounds_long - rounds_short) for stage in set(short) | set(long)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--head", default="parallel")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="5 layers: a smoke run")
    parser.add_argument("--hf", default=None, help="a transformers model folder as the trunk (model=hf; heads untrained, compute_match none)")
    args = parser.parse_args()
    args.layers = 5 if args.quick else args.layers  # blocks: 1 trunk block + 4 head blocks
    torch.manual_seed(0)
    if args.hf:  # built and checked as lab-train builds it (a plain HeadConfig would skip each head's own config class)
        model = build_model({"name": "hf", "path": args.hf}, {"name": args.head, "k": 4, "compute_match": "none"}).eval()
        args.layers = model.trunk.cfg.n_layers
    else:
        model = build_model({"vocab_size": 259, "d_model": 96, "n_layers": args.layers, "n_heads": 4}, {"name": args.head, "k": 4}).eval()
    prompt = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(0))
    stages = ["target pass", "draft blocks", "proposal", "acceptance", "other"]
    rows, greedy_host = [], float("nan")
    for temperature in (0.0, 1.0):
        plain = ops_per_round(model, prompt, temperature, False)
        for mode, counts in (("plain step", plain), ("speculative round", ops_per_round(model, prompt, temperature, True))):
            total = sum(counts.values())
            if temperature == 0 and mode != "plain step":
                greedy_host = counts.get("proposal", 0) + counts.get("acceptance", 0)
            rows.append([f"T={temperature:g}", mode, *[round(counts.get(s, 0), 1) for s in stages], round(total, 1),
                         round(total / sum(plain.values()), 2)])
    what = f"{args.hf} + untrained {args.head} K=4" if args.hf else f"{args.head} K=4 (compute_match=blocks), d_model 96, V=259, random weights"
    print(f"== aten ops per round: {what}, {args.layers} layers, prompt 64")
    print(table(["T", "mode", *stages, "total", "vs plain step"], rows))
    if model.head.drafter is IndependentHeads:
        print(f"goal: greedy proposal + acceptance <= 5 ops per round: {greedy_host:.1f} {verdict(greedy_host <= 5)}")
    else:  # a chain drafts step by step: each step projects, chooses and prepares the next depth's input (its own ops)
        print(f"greedy proposal + acceptance: {greedy_host:.1f} ops per round (a chain's proposal holds its depth steps' "
              "projections and input norms; the ≤ 5 goal is for independent heads)")


if __name__ == "__main__":
    main()

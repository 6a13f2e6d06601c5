"""Decoding speed at batch 1: KV-cached vs uncached, then plain vs speculative per architecture.

Part 1 (cached vs uncached): the default tiny model (byte vocabulary V=259, d_model 128,
4 layers, ntp), a 64-token prompt, 256 new greedy tokens. "uncached" re-runs the full
model on the growing sequence for every token (what decoding costs without KV caches);
"cached" is `lab.decode.generate`. Both must emit the same tokens.

Part 2 (speculative, with --runs RUN_DIR ...): for each trained run, plain cached vs
speculative decoding of the same prompts (cut from held-out stdlib documents), greedy and
temperature 1.0, interleaved. Prints tokens per target forward, acceptance by draft
position, the ledger's predicted speedup and the measured wall-clock speedup.

    python -m experiments.benchmarks.decode_speed                      # part 1, ~1 min
    python -m experiments.benchmarks.decode_speed --runs outputs/a outputs/b
    python -m experiments.benchmarks.decode_speed --quick              # seconds-long smoke run
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import Timing, interleave, paired_ratio, table, verdict  # isort: skip

import argparse

import torch

from lab.decode import generate
from lab.model.heads import HeadConfig
from lab.model.mtp import MTPModel
from lab.model.trunk import ModelConfig


def uncached_greedy(model: MTPModel, prompt: torch.Tensor, n: int) -> list[int]:
    """Greedy decoding with one full forward over the whole sequence per new token."""
    sequence = prompt.tolist()
    with torch.no_grad():
        for _ in range(n):
            tokens = torch.tensor(sequence)[None]  # [1, S]
            batch = {"tokens": tokens, "active": torch.ones_like(tokens, dtype=torch.bool), "segment_ids": torch.zeros_like(tokens),
                     "position_ids": torch.arange(tokens.shape[1])[None]}
            sequence.append(int(model.next_token_logits(batch)[0, -1].argmax()))
    return sequence[prompt.numel():]


def cached_vs_uncached(new_tokens: int, repeats: int) -> None:
    torch.manual_seed(0)
    model = MTPModel(ModelConfig(vocab_size=259), HeadConfig(name="ntp", k=1)).eval()
    prompt = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(0))
    same = generate(model, prompt, new_tokens).tokens == uncached_greedy(model, prompt, new_tokens)
    timings = interleave({"cached": lambda: generate(model, prompt, new_tokens), "uncached": lambda: uncached_greedy(model, prompt, new_tokens)},
                         repeats=repeats)
    rate = lambda t: Timing([new_tokens / s for s in t.samples])  # noqa: E731
    ratio = paired_ratio(timings["uncached"], timings["cached"])
    print(f"== cached vs uncached: ntp d_model=128 n_layers=4 V=259, prompt 64, {new_tokens} new greedy tokens, "
          f"{torch.get_num_threads()} threads, {repeats} interleaved rounds")
    print(table(["variant", "tokens/s median [IQR]", "s per call"], [[name, rate(t).describe(1, 1), t.describe(1, 3)] for name, t in timings.items()]))
    print(f"cached / uncached speed (paired): {ratio.describe(1, 2)}   same tokens: {same}")
    print(f"goal: cached faster than uncached with identical tokens: {verdict(same and ratio.median > 1)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    new_tokens, repeats = (16, 2) if args.quick else (args.new_tokens, args.repeats)
    cached_vs_uncached(new_tokens, repeats)


if __name__ == "__main__":
    main()

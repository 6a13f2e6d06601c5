"""Decoding speed at batch 1: KV-cached vs uncached, then plain vs speculative per architecture.

Part 1 (cached vs uncached): the default tiny model (byte vocabulary V=259, d_model 128,
4 layers, ntp), a 64-token prompt, 256 new greedy tokens. "uncached" re-runs the full
model on the growing sequence for every token (what decoding costs without KV caches);
"cached" is `lab.decode.generate`. Both must emit the same tokens.

Part 2 (speculative, with --runs RUN_DIR ...): for each trained run, plain cached vs
speculative decoding of the same prompts (the first ≤ 64 tokens of held-out documents of the
run's own validation split), temperature 1.0 (the headline) and greedy, alternating order,
`--spec-repeats` timed runs per prompt and mode. Prints the median distinct-4-gram ratio,
tokens per target forward, acceptance by draft position, mean emitted per round, the ledger's
predicted speedup S = E[R]·C_main/(C_draft + C_verify), the measured decode-phase speedup and
the per-prompt paired speedups. Continuations with < 20 % distinct 4-grams are degenerate:
"clean" rows exclude them, "all" rows keep them.

    python -m experiments.benchmarks.decode_speed                      # part 1, ~1 min
    python -m experiments.benchmarks.decode_speed --skip-cache-part --runs outputs/a outputs/b --prompts 16 --new-tokens 128
    python -m experiments.benchmarks.decode_speed --quick              # seconds-long smoke run
    python -m experiments.benchmarks.decode_speed --skip-cache-part --skip-spec-part --batch 1,4,16 --runs outputs/a   # batched throughput

Part 3 (--batch 1,4,16): plain vs speculative *throughput* of batched requests by batch size
(experiments/benchmarks/decode_batch.py), T=1 and greedy, for each run (or a random-weight model).
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import Timing, interleave, paired_ratio, table, verdict  # isort: skip

import argparse
import statistics
from pathlib import Path

import torch

from experiments.benchmarks.decode_batch import batch_report
from lab.decode.evaluation import DEGENERATE_BELOW, distinct_ngram_ratio, document_prompts
from lab.decode import generate
from lab.decode.ledger import decode_rate, ledger, merge
from lab.decode.loading import load_for_generation
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
    model = MTPModel(ModelConfig(vocab_size=259, n_layers=4), HeadConfig(name="ntp", k=1)).eval()  # as measured in its README
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


def held_out_prompts(run_dir: Path, count: int, length: int) -> list[list[int]]:
    """Prompts cut from the starts of the run's validation documents (its own data config and split)."""
    from omegaconf import OmegaConf

    from lab.data import LMDataModule

    cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
    datamodule = LMDataModule(**OmegaConf.to_container(cfg.data, resolve=True))
    datamodule.setup("fit")
    return document_prompts(datamodule.val_dataloader(), count, length)


def speculative_vs_plain(run_dir: Path, prompts: list[list[int]], new_tokens: int, temperature: float, eos: int | None, repeats: int) -> dict:
    """Per prompt, plain and speculative decoding `repeats` times each, alternating; ledgers and paired speedups.

    Prompts whose speculative continuation has < 20 % distinct 4-grams are `degenerate`: they
    are excluded from the headline figures ("clean") and reported separately ("all").
    """
    loaded = load_for_generation(run_dir)
    model = loaded.model
    groups = {"clean": {"plain": [], "speculative": [], "ratios": []}, "all": {"plain": [], "speculative": [], "ratios": []}}
    degenerate, matches, distinct = 0, 0, []
    for i, prompt in enumerate(prompts):
        ids = torch.tensor(prompt)
        runs: dict[str, list] = {"plain": [], "speculative": []}
        for r in range(repeats):
            order = ("plain", "speculative") if (i + r) % 2 == 0 else ("speculative", "plain")
            for name in order:
                generator = torch.Generator().manual_seed(1000 + i)  # the same draws every repeat
                runs[name].append(generate(model, ids, new_tokens, temperature=temperature, speculative=name == "speculative",
                                           eos=eos, generator=generator))
        plain, spec = runs["plain"][0], runs["speculative"][0]
        ratio = statistics.median(decode_rate(s.stats) / decode_rate(p.stats) for s, p in zip(runs["speculative"], runs["plain"]))
        ratio_4 = distinct_ngram_ratio(spec.tokens)
        distinct.append(ratio_4)
        matches += spec.tokens == plain.tokens
        clean = ratio_4 >= DEGENERATE_BELOW
        degenerate += not clean
        for group in (("clean", "all") if clean else ("all",)):
            groups[group]["plain"].append(plain.stats), groups[group]["speculative"].append(spec.stats), groups[group]["ratios"].append(ratio)
            groups[group].setdefault("distinct4", []).append(ratio_4)
    out = {"head": model.head_cfg.name, "k": model.k, "prompts": len(prompts), "degenerate": degenerate, "matches": matches,
           "distinct4": statistics.median(distinct) if distinct else float("nan")}
    for name, group in groups.items():
        if group["speculative"]:
            out[name] = {**ledger(merge(group["speculative"]), merge(group["plain"])), "paired_speedup": Timing(group["ratios"]),
                         "distinct4": statistics.median(group["distinct4"])}
    return out


def speculative_report(run_dirs: list[Path], n_prompts: int, prompt_tokens: int, new_tokens: int, repeats: int) -> None:
    print(f"\n== speculative vs plain, batch 1, {torch.get_num_threads()} threads, {new_tokens} new tokens, {repeats} repeats per prompt, "
          f"prompts: first ≤{prompt_tokens} tokens of held-out documents")
    best = {}
    headers = ["run", "head", "prompts", "distinct4", "tokens/forward", "accept by position", "mean R", "ledger S", "measured S",
               "paired S median [IQR]", "greedy match"]
    for temperature, label in ((1.0, "sampling T=1.0 (headline)"), (0.0, "greedy")):
        rows = []
        for run_dir in run_dirs:
            prompts = held_out_prompts(run_dir, n_prompts, prompt_tokens)
            eos = load_for_generation(run_dir).tokenizer.eos_id
            r = speculative_vs_plain(run_dir, prompts, new_tokens, temperature, eos, repeats)
            for group in ("clean", "all"):
                if group not in r:
                    rows.append([run_dir.name, f"{r['head']} K={r['k']}", f"{group}: none", r["distinct4"], "", "", "", "", "", "", ""])
                    continue
                g = r[group]
                n = r["prompts"] - (r["degenerate"] if group == "clean" else 0)
                rows.append([run_dir.name, f"{r['head']} K={r['k']}", f"{group}: {n}/{r['prompts']}", g["distinct4"], g["tokens_per_forward"],
                             ",".join(f"{a:.2f}" for a in g["accept_by_position"]), g["mean_R"], g["predicted_speedup"], g["measured_speedup"],
                             g["paired_speedup"].describe(1, 2), f"{r['matches']}/{r['prompts']}" if temperature == 0 else "n/a"])
                if r["k"] == 4:
                    key = (temperature, group)
                    best[key] = max(best.get(key, (0.0, 0.0)), (g["tokens_per_forward"], g["paired_speedup"].median))
        print(f"-- {label} (clean = degenerate continuations excluded)")
        print(table(headers, rows))
    sampled, greedy, greedy_all = best.get((1.0, "clean"), (0.0, 0.0)), best.get((0.0, "clean"), (0.0, 0.0)), best.get((0.0, "all"), (0.0, 0.0))
    print(f"goal: tokens per target forward >= 2.5 for the best K=4 run (sampling T=1, clean): {sampled[0]:.2f} {verdict(sampled[0] >= 2.5)}")
    print(f"goal: speculative/plain wall clock >= 1.5x at batch 1 (greedy, identical output, clean): {greedy[1]:.2f} {verdict(greedy[1] >= 1.5)}"
          f"   (all prompts incl. degenerate: {greedy_all[1]:.2f}; sampling T=1 clean: {sampled[1]:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", nargs="*", type=Path, default=[], help="trained run dirs for the speculative part")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--spec-repeats", type=int, default=3, help="timed runs per prompt and mode (speculative part)")
    parser.add_argument("--skip-cache-part", action="store_true")
    parser.add_argument("--skip-spec-part", action="store_true", help="with --runs: skip the batch-1 speculative part (e.g. only --batch)")
    parser.add_argument("--batch", type=lambda text: [int(b) for b in text.split(",")], default=None,
                        help="batch sizes, e.g. 1,4,16: plain vs speculative throughput of batched requests (runs, or a random parallel K=4 model)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    new_tokens, repeats = (16, 2) if args.quick else (args.new_tokens, args.repeats)
    if not args.skip_cache_part:
        cached_vs_uncached(new_tokens, repeats)
    if args.runs and not args.skip_spec_part:
        speculative_report(args.runs, args.prompts, args.prompt_tokens, args.new_tokens, 1 if args.quick else args.spec_repeats)
    if args.batch:
        batch_report(batch_models(args.runs, args.prompts, args.prompt_tokens), args.batch, new_tokens, 1 if args.quick else args.spec_repeats)


def batch_models(run_dirs: list[Path], n_prompts: int, prompt_tokens: int) -> list:
    """(name, model, held-out prompts, eos) per run; without runs a random-weight parallel K=4 model and random prompts."""
    if not run_dirs:
        torch.manual_seed(0)
        model = MTPModel(ModelConfig(vocab_size=259), HeadConfig(name="parallel", k=4, compute_match="next_token_path")).eval()
        prompts = torch.randint(0, 256, (n_prompts, prompt_tokens), generator=torch.Generator().manual_seed(0)).tolist()
        return [("random-weight parallel K=4 (acceptance meaningless: mechanics only)", model, prompts, None)]
    out = []
    for run_dir in run_dirs:
        loaded = load_for_generation(run_dir)
        out.append((f"{run_dir.name} ({loaded.model.head_cfg.name} K={loaded.model.k})", loaded.model,
                    held_out_prompts(run_dir, n_prompts, prompt_tokens), loaded.tokenizer.eos_id))
    return out


if __name__ == "__main__":
    main()

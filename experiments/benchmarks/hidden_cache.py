"""Head-only training step from the hidden-state cache vs the live frozen step, on the same rows.

One step = collate B rows, forward (live: the frozen trunk runs; cached: the rows carry the trunk's
states, read from a real cache entry), `sequential` schedule run, backward, AdamW step over the heads
(lab.training.step.train_step, as lab-train runs it). The two variants alternate on one model and
optimizer, interleaved in rotated order (experiments/benchmarks/common.py), timed by per-thread CPU
time (torch on one thread by default, so the thread's CPU time is the whole step's compute and other
load on a shared machine does not count) and by wall time. Where the time goes is measured inside the
same rounds: the trunk's forward alone, reading + collating the cached rows, and the vocabulary
projections + losses + their backward (the schedule's run) as a share of the same cached step.

    python -m experiments.benchmarks.hidden_cache                        # tiny Llama, V=49152 (~2 min)
    python -m experiments.benchmarks.hidden_cache --model /path/to/hf    # a local HF model folder
    python -m experiments.benchmarks.hidden_cache --quick                # seconds-long smoke run
    python -m experiments.benchmarks.hidden_cache --model PATH --draft-vocab 4096   # heads over a draft vocabulary

With `--draft-vocab N` (head.draft_vocab) live and cached steps run the same model with the same N ids. The
rows are then real text so that the share of targets the set covers is realistic: Python standard-library
modules tokenized by the model's own tokenizer (`--model`), packed into rows of S tokens; the N ids are the
most frequent over `--count-files` modules (the timed rows among them). Without `--model` (no tokenizer)
the tokens are drawn from a Zipf law (rank r ∝ 1/r over a fixed permutation of the ids).
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import Timing, interleave, paired_ratio, table, verdict  # isort: skip

import argparse
import tempfile
import time

import torch
from torch.utils.data import default_collate

from experiments.benchmarks.mtp_overhead import random_batches
from lab.nn.draft_vocab import most_frequent_ids, training_token_counts
from lab.model.mtp import build_model
from lab.objective.objective import Objective
from lab.objective.weights import Progress
from lab.training.hidden_cache import open_hidden_cache
from lab.training.step import PlainOptimization, train_step

TINY_LLAMA = {"model_type": "llama", "vocab_size": 49152, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 6,
              "num_attention_heads": 8, "num_key_value_heads": 4}
HEADS = {"medusa": {"name": "medusa", "k": 5}, "parallel": {"name": "parallel", "k": 4}, "deepseek": {"name": "deepseek", "depth": 1}}
GOAL = 0.5  # a cached step costs at most this share of a live frozen step


class Bench:
    """One frozen-trunk model, its AdamW and objective; rows as a list (live) and as a cache entry (cached)."""

    def __init__(self, model_cfg: dict, head: str, target: str, rows: list[dict], batch: int, cache_root: str,
                 draft_ids: torch.Tensor | None = None):
        torch.manual_seed(0)
        draft = None if draft_ids is None else draft_ids.numel()
        self.model = build_model(model_cfg, {**HEADS[head], "trunk_grad": "frozen", "draft_vocab": draft})
        self.model.set_draft_ids(draft_ids)
        self.objective = Objective.build({"policy": "head_mean"}, {"name": "uniform"}, {"name": "sequential"}, k=self.model.k,
                                         objective={"target": target})
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-4)
        self.optimization = PlainOptimization(self.model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0), 1.0)
        self.rows, self.batch = rows, batch
        self.cached, self.record = open_hidden_cache(self.model, rows, cache_root, batch_size=batch)
        self.position = {"live": 0, "cached": 0, "trunk": 0}
        self.projection_shares: list[float] = []  # per cached step: the schedule's share of that same step's CPU time
        self.projection_seconds = 0.0
        run = self.objective.backward_schedule.run

        def timed_run(*args, **kwargs):  # the schedule's V-wide work, timed inside the step
            start = time.thread_time()
            out = run(*args, **kwargs)
            self.projection_seconds = time.thread_time() - start
            return out

        self.objective.backward_schedule.run = timed_run

    def next_indices(self, variant: str) -> list[int]:
        start = self.position[variant]
        self.position[variant] = (start + self.batch) % len(self.rows)
        return [(start + i) % len(self.rows) for i in range(self.batch)]

    def step(self, batch: dict) -> None:
        train_step(self.model, self.objective, batch, Progress(step=0, consumed_tokens=0, total_steps=1), self.optimization)

    def live(self) -> None:
        self.step(default_collate([self.rows[i] for i in self.next_indices("live")]))

    def cached_step(self) -> None:
        start = time.thread_time()
        self.step(default_collate([self.cached[i] for i in self.next_indices("cached")]))
        self.projection_shares.append(self.projection_seconds / (time.thread_time() - start))

    def read_cached(self) -> None:
        default_collate([self.cached[i] for i in self.next_indices("trunk")])

    @torch.no_grad()
    def trunk(self) -> None:
        batch = default_collate([self.rows[i] for i in self.next_indices("trunk")])
        ctx = self.model.trunk.attention_context(batch["segment_ids"], batch["position_ids"], batch["active"])
        self.model.trunk(batch["tokens"], ctx)  # [B, S, d]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="a local Hugging Face model folder (default: a tiny Llama config, V=49152)")
    parser.add_argument("--head", choices=sorted(HEADS), default="medusa")
    parser.add_argument("--target", choices=("data", "distill", "mix"), default="data")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--quick", action="store_true", help="tiny smoke configuration (seconds)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--draft-vocab", type=int, default=None, help="head.draft_vocab: horizons >= 2 over the N most frequent ids")
    parser.add_argument("--count-files", type=int, default=400, help="standard-library modules the draft ids are counted over")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    repeats = args.repeats or (2 if args.quick else 8)
    warmup = 0 if args.quick else 1
    llama = {**TINY_LLAMA, "num_hidden_layers": 2, "vocab_size": 4096} if args.quick else TINY_LLAMA
    model_cfg = {"name": "hf", "dtype": args.dtype, **({"path": args.model} if args.model else {"config": llama})}
    vocab = llama["vocab_size"] if not args.model else build_model(model_cfg, {"name": "ntp"}).trunk.cfg.vocab_size
    rows, draft_ids, note = benchmark_rows(args, vocab)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as root:
        bench = Bench(model_cfg, args.head, args.target, rows, args.batch, root, draft_ids)
        built = time.perf_counter() - start
        variants = {"live frozen step": bench.live, "cached step": bench.cached_step, "trunk forward only": bench.trunk,
                    "cache read + collate": bench.read_cached}
        cpu = interleave(variants, repeats=repeats, warmup=warmup, clock=time.thread_time)
        wall = interleave({name: variants[name] for name in ("live frozen step", "cached step")}, repeats=repeats, warmup=warmup)
        shares = Timing(bench.projection_shares[warmup:][:repeats])  # the CPU-timed rounds' cached steps
    cfg = bench.model.trunk.cfg
    print(f"hidden_cache: head={args.head} (K={bench.model.k}) target={args.target} on "
          f"{args.model or f'a tiny Llama config (d {cfg.d_model}, {cfg.n_layers} layers)'}, V={cfg.vocab_size}, {args.dtype}; "
          f"B x S = {args.batch}x{args.seq}; {torch.get_num_threads()} thread(s); {repeats} interleaved repeats after {warmup} warm-up; "
          f"cache of {len(rows)} rows built in {bench.record['seconds']:.1f} s ({bench.record['bytes'] / 2**20:.1f} MiB); setup {built:.1f} s")
    print(note)
    live = cpu["live frozen step"]
    rows_out = [[name, timing.ms(), f"{timing.median / live.median:.3f}"] for name, timing in cpu.items()]
    print(table(["per-thread CPU time", "ms median [IQR]", "/ live step"], rows_out))
    ratio = paired_ratio(cpu["cached step"], live)
    wall_ratio = paired_ratio(wall["cached step"], wall["live frozen step"])
    print(f"cached / live (paired, CPU time): {ratio.describe()}; wall time: {wall_ratio.describe()} "
          f"(live {wall['live frozen step'].ms()} ms, cached {wall['cached step'].ms()} ms)")
    q1, q3 = shares.iqr
    print(f"where the cached step's time goes (paired within each step): vocabulary projections + losses + their backward "
          f"{shares.median:.0%} [{q1:.0%}–{q3:.0%}], heads' own layers + optimizer + the rest {1 - shares.median:.0%}")
    print(f"goal: cached step <= {GOAL} x live frozen step (CPU time): {ratio.median:.3f} {verdict(ratio.median <= GOAL)}")


def benchmark_rows(args, vocab: int) -> tuple[list[dict], torch.Tensor | None, str]:
    """(the B·4 timed rows, the draft ids or None, a line saying what they are)."""
    n_rows = args.batch * 4
    if args.draft_vocab is None:
        rows = [{name: value[0] for name, value in batch.items()} for batch in random_batches(vocab, 1, args.seq, n_rows)]
        return rows, None, "rows: uniform random tokens; full vocabulary"
    if args.model:
        rows, what = stdlib_rows(args.model, args.seq, args.count_files)
    else:
        rows, what = zipf_rows(vocab, args.seq, n_rows * 8), "Zipf-distributed random tokens"
    ids = most_frequent_ids(training_token_counts(rows, vocab), args.draft_vocab)
    timed = rows[:n_rows]
    counts = training_token_counts(timed, vocab)
    coverage = float(counts[ids].sum()) / float(counts.sum())
    return timed, ids, (f"rows: {what}; draft vocabulary N = {ids.numel()} most frequent over {len(rows)} rows, "
                        f"covering {coverage:.1%} of the timed rows' tokens")


def stdlib_rows(model_path: str, seq: int, n_files: int) -> tuple[list[dict], str]:
    """Python standard-library modules (sorted by path) tokenized by the model's tokenizer, packed into rows of `seq`."""
    import sysconfig
    from pathlib import Path

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:n_files]
    stream = [t for f in files for t in tokenizer(f.read_text(errors="replace"))["input_ids"] + [tokenizer.eos_token_id]]
    packed = torch.tensor(stream[: len(stream) // seq * seq]).view(-1, seq)  # [R, S]
    return [packed_row(tokens) for tokens in packed], f"{len(files)} standard-library modules ({len(stream)} tokens)"


def zipf_rows(vocab: int, seq: int, n_rows: int) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    law = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)  # [V] rank r ∝ 1/r
    ids = torch.randperm(vocab, generator=generator)  # rank -> id
    tokens = ids[torch.multinomial(law, n_rows * seq, replacement=True, generator=generator)].view(n_rows, seq)  # [R, S]
    return [packed_row(row) for row in tokens]


def packed_row(tokens: torch.Tensor) -> dict:
    seq = tokens.numel()
    return {"tokens": tokens, "active": torch.ones(seq, dtype=torch.bool), "segment_ids": torch.zeros(seq, dtype=torch.long),
            "position_ids": torch.arange(seq)}


if __name__ == "__main__":
    main()

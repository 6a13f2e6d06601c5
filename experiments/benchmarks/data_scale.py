"""Data at scale: memory, disk and loader speed of the memory-mapped packed rows (issue 20).

For each corpus size (tokens of the byte tokenizer) a synthetic corpus is generated
locally (jsonl shards of Zipf-distributed pseudo-words, documents of 200–4000 bytes,
fixed seed), then a fresh child process

1. prepares it with the real `LMDataModule` (`data=text`, extension inference, byte
   tokenizer, seq 128, batch 16, `num_proc` auto) into an empty cache, and
2. iterates training batches through `train_dataloader()` with one DataLoader worker
   (shuffled rows: random access into the mapped file), timed in blocks of batches.

A sampler thread reads `/proc/<pid>/smaps_rollup` of the child and of its child processes
(tokenizing workers, the DataLoader worker) every 20 ms and sums their proportional set
sizes (PSS: a page shared by a forked worker and its parent counts once in the sum, not
twice as with RSS). Reported per phase: peak growth over the child's post-import baseline
of PSS (all resident pages, the memory-mapped cache's page-cache pages included) and of
anonymous PSS (private memory: what would run a machine out of RAM). Disk: bytes of the tokenized cache (`ids` + document offsets
+ `n_bytes`) per token.

Training speed: the default tiny model (the real composed config, `lab-train` defaults)
trained by a real Lightning Trainer on the stdlib corpus; per-step wall times after
warm-up. Goal: one loader worker delivers ≥ 20× its tokens/s.

Goals (issue 20): peak RSS growth < 1 GiB at every size; ≤ 4 bytes/token on disk
(+ a small index); loader tokens/s ≥ 20 × training tokens/s.

    python -m experiments.benchmarks.data_scale                      # 2M and 20M tokens (~5 min, 2 cores)
    python -m experiments.benchmarks.data_scale --tokens 20M,200M    # the issue's comparison (~1.1 GB on disk)
    python -m experiments.benchmarks.data_scale --quick              # seconds-long smoke run

Generated corpora and caches live in a temporary folder (or `--workdir`) and are deleted at the end.
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import Timing, compose, table, verdict  # isort: skip

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

MIB = 1 << 20
GIB = 1 << 30
# Proportional set sizes: a page shared by the parent and a forked worker counts half in each.
STATUS_FIELDS = ("Pss", "Pss_Anon")
SEQ_LEN, BATCH = 128, 16


# -------------------------------------------------------------------- the corpus


def parse_tokens(text: str) -> int:
    scale = {"k": 10**3, "M": 10**6, "G": 10**9}
    return int(float(text[:-1]) * scale[text[-1]]) if text[-1] in scale else int(text)


def generate_corpus(folder: Path, n_tokens: int, seed: int = 0, shard_tokens: int = 50_000_000) -> int:
    """jsonl shards whose byte-tokenized size (UTF-8 bytes + one EOS per document) is ≈ n_tokens; returns docs."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    words = ["".join(map(chr, rng.choice(letters, size=rng.integers(2, 10)))) for _ in range(20_000)]
    weights = 1.0 / np.arange(1, len(words) + 1)  # Zipf-like word frequencies
    weights /= weights.sum()
    folder.mkdir(parents=True, exist_ok=True)
    written, n_docs, shard, handle = 0, 0, 0, None
    while written < n_tokens:
        if handle is None or handle.tell() > shard_tokens:
            if handle is not None:
                handle.close()
            handle = open(folder / f"shard-{shard:04d}.jsonl", "w", encoding="utf-8")
            shard += 1
        target = int(rng.integers(200, 4000))
        picked = rng.choice(len(words), size=target // 6 + 1, p=weights)
        text = " ".join(words[i] for i in picked)[:target]
        handle.write(json.dumps({"text": text}) + "\n")
        written += len(text) + 1
        n_docs += 1
    handle.close()
    return n_docs


# ------------------------------------------------------------------ memory probe


def _status(pid: int) -> dict[str, int]:
    values = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in STATUS_FIELDS:
                    values[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return values


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


class MemoryProbe:
    """Peak RSS and anonymous RSS of this process plus its descendants, sampled in a thread."""

    def __init__(self, interval: float = 0.02):
        self.interval = interval
        self.peak = dict.fromkeys(STATUS_FIELDS, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> dict[str, int]:
        total = dict.fromkeys(STATUS_FIELDS, 0)
        pending, seen = [os.getpid()], set()
        while pending:
            pid = pending.pop()
            if pid in seen:
                continue
            seen.add(pid)
            for key, value in _status(pid).items():
                total[key] += value
            pending += _children(pid)
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, value in self.sample().items():
                self.peak[key] = max(self.peak[key], value)
            time.sleep(self.interval)

    def __enter__(self) -> MemoryProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# --------------------------------------------------------------- child: one size


def measure_size(corpus: Path, cache: Path, n_batches: int, block: int) -> dict:
    """Prepare and iterate one corpus in this (fresh) process; returns the numbers as a dict."""
    import torch

    from lab.data import LMDataModule

    torch.set_num_threads(1)
    probe = MemoryProbe()
    baseline = probe.sample()
    result: dict = {"baseline": baseline}
    with probe:
        start = time.perf_counter()
        datamodule = LMDataModule(source="auto", path=str(corpus), max_docs=None, seq_len=SEQ_LEN, batch_size=BATCH,
                                  val_fraction=0.01, num_workers=1, cache_dir=str(cache), max_val_rows=256)
        datamodule.setup("fit")
        result["prepare_s"] = time.perf_counter() - start
    result["prepare_peak"] = dict(probe.peak)
    result["stats"] = datamodule.corpus_stats
    tokenized = sorted((cache / "tokenized").glob("*.arrow"))
    result["tokenized_bytes"] = sum(f.stat().st_size for f in tokenized)
    result["hf_text_cache_bytes"] = sum(f.stat().st_size for f in (cache / "hf").rglob("*.arrow"))
    result["dtype"] = str(datamodule.train_rows.stream.chunks()[0][0].dtype)

    probe = MemoryProbe()
    with probe:
        loader = endless_batches(datamodule.train_dataloader())
        for _ in range(block):  # warm-up: worker start, first pages
            next(loader)
        blocks = []
        for _ in range(n_batches // block):
            start = time.perf_counter()
            for _ in range(block):
                batch = next(loader)
            blocks.append(time.perf_counter() - start)
        assert batch["tokens"].shape == (BATCH, SEQ_LEN)
        del loader
    result["iterate_peak"] = dict(probe.peak)
    result["block_s"] = blocks
    return result


def endless_batches(loader):
    """Epoch after epoch, reshuffled as Lightning does (`set_epoch`); the persistent worker is reused."""
    for epoch in itertools.count():
        loader.sampler.set_epoch(epoch)
        yield from loader


# ------------------------------------------------------------- training speed


def training_step_times(steps: int, warmup: int) -> Timing:
    """Per-step wall times of the default `lab-train` job (composed config, real Trainer, stdlib corpus)."""
    import pytorch_lightning as pl
    import torch

    from lab.train import build

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    datamodule, module = build(compose("model.n_layers=4", f"trainer.max_steps={steps}"))  # the 4-layer model its README measured
    stamps: list[float] = []

    class Stamp(pl.Callback):
        def on_train_batch_end(self, *args):
            stamps.append(time.perf_counter())

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0,
                         num_sanity_val_steps=0, callbacks=[Stamp()])
    trainer.fit(module, datamodule=datamodule)
    return Timing(list(np.diff(stamps[warmup:])))


# ------------------------------------------------------------------------ main


def run_child(corpus: Path, cache: Path, n_batches: int, block: int) -> dict:
    code = (
        "import json, sys; from pathlib import Path; "
        "from experiments.benchmarks.data_scale import measure_size; "
        f"print('RESULT ' + json.dumps(measure_size(Path({str(corpus)!r}), Path({str(cache)!r}), {n_batches}, {block})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"child failed:\n{out.stderr[-3000:]}")
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="2M,20M", help="comma-separated corpus sizes (k/M/G suffixes)")
    parser.add_argument("--batches", type=int, default=1500, help="timed loader batches per size")
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument("--workdir", default=None, help="where corpora and caches go (deleted afterwards)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few batches and steps (smoke run)")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.batches, args.train_steps = "200k,1M", 200, 12
    sizes = [parse_tokens(t) for t in args.tokens.split(",")]
    block = max(1, min(250, args.batches // 8))

    workdir = Path(tempfile.mkdtemp(prefix="data-scale-", dir=args.workdir))
    try:
        results = {}
        for size in sizes:
            corpus, cache = workdir / f"corpus-{size}", workdir / f"cache-{size}"
            start = time.perf_counter()
            n_docs = generate_corpus(corpus, size)
            print(f"generated {size:,} tokens ({n_docs:,} docs) in {time.perf_counter() - start:.0f} s", flush=True)
            results[size] = run_child(corpus, cache, args.batches, block)
            shutil.rmtree(corpus)
            shutil.rmtree(cache)
        train = training_step_times(args.train_steps, warmup=max(2, args.train_steps // 6))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    train_tps = BATCH * SEQ_LEN / train.median
    rows, ok_memory, ok_disk, ok_speed = [], True, True, True
    for size, r in results.items():
        stats = r["stats"]
        n_tokens = stats["n_tokens_train"] + stats["n_tokens_val"]
        grow = {phase: {k: r[f"{phase}_peak"][k] - r["baseline"][k] for k in STATUS_FIELDS} for phase in ("prepare", "iterate")}
        per_token = r["tokenized_bytes"] / n_tokens
        loader = Timing([BATCH * SEQ_LEN * block / s for s in r["block_s"]])  # tokens/s per block
        ok_memory &= all(g["Pss"] < GIB for g in grow.values())
        ok_disk &= per_token <= 4.0
        ok_speed &= loader.median >= 20 * train_tps
        rows.append([
            f"{n_tokens / 1e6:.1f}M", f"{r['prepare_s']:.0f}", f"{grow['prepare']['Pss'] / MIB:.0f}",
            f"{grow['prepare']['Pss_Anon'] / MIB:.0f}", f"{grow['iterate']['Pss'] / MIB:.0f}",
            f"{grow['iterate']['Pss_Anon'] / MIB:.0f}", f"{per_token:.3f} ({r['dtype']})",
            loader.describe(1e-3, 0), f"{loader.median / train_tps:.0f}x",
        ])
    print()
    print(table(["tokens", "prepare s", "prep ΔPSS MiB", "prep Δanon MiB", "iter ΔPSS MiB", "iter Δanon MiB",
                 "disk B/token", "loader ktok/s [IQR]", "vs train"], rows))
    print(f"\ntraining (default tiny model, {args.train_steps} steps): {train.ms()} ms/step "
          f"= {train_tps:,.0f} tokens/s median")
    print("ΔPSS counts the mapped cache's page-cache pages (reclaimable); Δanon is private memory.")
    print(f"goal peak memory (PSS) growth < 1 GiB at every size: {verdict(ok_memory)}")
    print(f"goal <= 4 bytes/token on disk: {verdict(ok_disk)}")
    print(f"goal loader tokens/s >= 20 x training tokens/s: {verdict(ok_speed)}")


if __name__ == "__main__":
    main()

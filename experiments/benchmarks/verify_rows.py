"""What verifying r rows costs through a whole transformers model, relative to one row, per dtype.

A speculative round pays one target pass over the frontier and its drafts; it wins only if r rows
cost little more than one. After a cached prefix of `--prefix` tokens, each variant appends r rows
and crops them again; variants (dtype × r) are interleaved, timed in per-thread CPU time (the
machine is shared), median of `--repeats`.

    python -m experiments.benchmarks.verify_rows /work/models/smollm2-135m-hf --threads 1
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import table  # isort: skip

import argparse
import statistics
import time

import torch

ROWS = (1, 2, 4, 8)


def appended_rows_cost(model, cache, rows: int) -> float:
    start_len = cache.get_seq_length()
    ids = torch.ones(1, rows, dtype=torch.long)
    positions = torch.arange(start_len, start_len + rows)[None]
    begin = time.thread_time()
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, position_ids=positions, use_cache=True, logits_to_keep=rows)
    elapsed = time.thread_time() - begin
    cache.crop(-rows)  # transformers 5: crop(-n) removes the last n rows
    return elapsed


def main() -> None:
    from transformers import AutoModelForCausalLM, DynamicCache

    parser = argparse.ArgumentParser()
    parser.add_argument("model", help="a transformers model folder")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prefix", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
        cache = DynamicCache()
        with torch.no_grad():
            model(input_ids=torch.arange(args.prefix)[None] % 1000 + 100, past_key_values=cache, use_cache=True)
        for rows in ROWS:
            variants[(str(dtype)[6:], rows)] = (model, cache, rows)
    samples = {key: [] for key in variants}
    for repeat in range(args.repeats + 1):
        keys = list(variants)
        for key in keys[repeat % len(keys):] + keys[: repeat % len(keys)]:
            cost = appended_rows_cost(*variants[key])
            if repeat:
                samples[key].append(cost)
    median = {key: statistics.median(values) for key, values in samples.items()}
    rows = []
    for dtype in ("float32", "bfloat16"):
        one = median[(dtype, 1)]
        rows.append([dtype, f"{one * 1e3:.1f}", *[f"{median[(dtype, r)] / one:.2f}×" for r in ROWS[1:]], f"{one / median[('float32', 1)]:.2f}×"])
    print(f"== verify rows through {args.model}: {args.threads} thread(s), cached prefix {args.prefix}, per-thread CPU time, "
          f"median of {args.repeats} interleaved")
    print(table(["dtype", "1 row ms", *[f"{r} rows" for r in ROWS[1:]], "1 row vs fp32"], rows))


if __name__ == "__main__":
    main()

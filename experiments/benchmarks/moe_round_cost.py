"""Round cost vs draft count on a dense and an MoE model of equal active parameters (bf16, CPU).

A speculative round verifies r = 1 + m rows (m drafts) in one target pass. On a dense model the pass reads every
weight once whatever r is, so r rows cost about one row while compute is cheap. On an MoE model the r rows are
routed independently: the pass reads the union of the experts they chose, up to min(E, k·r) per layer, so its
weight traffic grows with r. Both models are deepseek_v3 (MLA) with the same attention and width; the MoE one has
E routed experts of width I (top-k) plus one shared expert in every layer, the dense one an MLP of width (k + 1)·I:
the same parameters active per token.

After a cached prefix, each variant (model × r) appends r rows of random tokens and crops them again; variants are
interleaved, timed in per-thread CPU time (the machine is shared), median [quartiles] of `--repeats`. Beside the
times: the mean distinct experts an r-row pass touched per MoE layer. Then one speculative decode of the MoE model
with one native MTP depth (D = 2) through the MoE ledger (lab/decode_core/moe_ledger.py).

    python -m experiments.benchmarks.moe_round_cost --repeats 9
"""

from __future__ import annotations

# common first: it sets OMP_WAIT_POLICY before torch loads OpenMP.
from experiments.benchmarks.common import Timing, table  # isort: skip

import argparse
import time

import torch

ROWS = (1, 2, 3, 4, 6, 8)
WIDTH, LAYERS, EXPERTS, TOP_K, EXPERT_WIDTH, VOCAB = 256, 4, 16, 2, 128, 4096
COMMON = dict(model_type="deepseek_v3", vocab_size=VOCAB, hidden_size=WIDTH, num_hidden_layers=LAYERS, num_attention_heads=4,
              num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
              moe_intermediate_size=EXPERT_WIDTH, n_routed_experts=EXPERTS, num_experts_per_tok=TOP_K, n_group=1, topk_group=1,
              n_shared_experts=1, max_position_embeddings=512, tie_word_embeddings=False)
CONFIGS = {"dense": {**COMMON, "first_k_dense_replace": LAYERS, "intermediate_size": (TOP_K + 1) * EXPERT_WIDTH},
           "moe": {**COMMON, "first_k_dense_replace": 0, "intermediate_size": (TOP_K + 1) * EXPERT_WIDTH}}


def build(config: dict, dtype):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    values = dict(config)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(values.pop("model_type"), **values), dtype=dtype).eval()


def active_parameters(model) -> int:
    """Parameters a token uses: all but the routed experts it does not choose (and the embedding table)."""
    total = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    routed = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    return total - routed + routed * TOP_K // EXPERTS


class ExpertCounter:
    """Distinct experts each router chose in the last pass (forward hooks on transformers' router modules)."""

    def __init__(self, model):
        from lab.nn.moe import is_router

        self.last: list[int] = []
        self.handles = [m.register_forward_hook(self.record) for m in model.modules() if is_router(m)]

    def record(self, module, args, output):
        self.last.append(len(set(output[-1].reshape(-1).tolist())))  # output: (logits, weights, expert ids [N, k])


def verify_pass(model, cache, rows: int, generator: torch.Generator) -> None:
    start = cache.get_seq_length()
    ids = torch.randint(0, VOCAB, (1, rows), generator=generator)
    positions = torch.arange(start, start + rows)[None]
    with torch.no_grad():
        model(input_ids=ids, cache=cache, position_ids=positions, use_cache=True, logits_to_keep=rows)
    cache.crop(-rows)  # transformers 5: crop(-n) removes the last n rows


def measure(args) -> None:
    from transformers import DynamicCache

    models, caches, counters = {}, {}, {}
    for name, config in CONFIGS.items():
        models[name] = build(config, torch.bfloat16)
        caches[name] = DynamicCache()
        with torch.no_grad():
            models[name](input_ids=torch.randint(0, VOCAB, (1, args.prefix), generator=torch.Generator().manual_seed(1)),
                         cache=caches[name], use_cache=True)
        counters[name] = ExpertCounter(models[name])
    generator = torch.Generator().manual_seed(2)
    variants = [(name, rows) for name in models for rows in ROWS]
    samples = {key: [] for key in variants}
    distinct = {key: [] for key in variants}
    for repeat in range(args.repeats + 1):
        shift = repeat % len(variants)
        for name, rows in variants[shift:] + variants[:shift]:
            counters[name].last = []
            begin = time.thread_time()
            verify_pass(models[name], caches[name], rows, generator)
            elapsed = time.thread_time() - begin
            if repeat:  # the first sweep warms up
                samples[(name, rows)].append(elapsed)
                if counters[name].last:
                    distinct[(name, rows)].append(sum(counters[name].last) / len(counters[name].last))
    timing = {key: Timing(values) for key, values in samples.items()}
    print(f"== verify pass cost vs rows r = 1 + drafts: deepseek_v3 bf16, d={WIDTH}, {LAYERS} layers, cached prefix {args.prefix}, "
          f"{torch.get_num_threads()} thread(s), per-thread CPU time, median [quartiles] of {args.repeats} interleaved")
    print(f"   active parameters per token (without embeddings): dense {active_parameters(models['dense']) / 1e6:.2f} M, "
          f"moe {active_parameters(models['moe']) / 1e6:.2f} M ({EXPERTS} experts of width {EXPERT_WIDTH}, top-{TOP_K}, 1 shared)")
    rows_out = []
    for rows in ROWS:
        dense, moe = timing[("dense", rows)], timing[("moe", rows)]
        touched = distinct[("moe", rows)]
        rows_out.append([rows, dense.ms(), f"{dense.median / timing[('dense', 1)].median:.2f}×", moe.ms(),
                         f"{moe.median / timing[('moe', 1)].median:.2f}×", f"{sum(touched) / len(touched):.1f} / {EXPERTS}",
                         f"{min(EXPERTS, TOP_K * rows)}", f"{moe.median / dense.median:.2f}"])
    print(table(["r rows", "dense ms", "dense vs 1 row", "moe ms", "moe vs 1 row", "experts touched / layer", "bound min(E, k·r)",
                 "moe / dense"], rows_out))


def ledger_demo() -> None:
    from lab.decode.generate import generate
    from lab.decode_core.moe_ledger import MoELedger, ledger_line
    from lab.model.mtp import build_model

    torch.manual_seed(0)
    config = {**CONFIGS["moe"], "first_k_dense_replace": 1}
    model = build_model({"name": "hf", "config": config}, {"name": "deepseek", "depth": 2, "block": "native"}).eval()
    prompt = torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(3))
    with MoELedger(model) as ledger:
        out = generate(model, prompt, 24, speculative=True)
    print("== MoE ledger of one speculative decode (float32, random weights, D = 2, 24 new tokens)")
    print(ledger_line(ledger.report(out.stats)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prefix", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    measure(args)
    ledger_demo()


if __name__ == "__main__":
    main()

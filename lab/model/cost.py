"""What a model costs: blocks, parameters and training FLOPs per token (run.json `cost`, the console table)."""

from __future__ import annotations

from lab.nn.flops import training_flops_per_token
from lab.model.mtp import MTPModel, parameter_table


def cost_table(model: MTPModel, seq_len: int) -> dict:
    """`parameter_table` plus `train_flops_per_token` (forward + backward, see lab/nn/flops.py)."""
    return {**parameter_table(model), "seq_len": seq_len, "train_flops_per_token": training_flops_per_token(model, seq_len)}


def format_cost_table(table: dict) -> str:
    """A few aligned lines for the console."""
    rows = [
        ("model", f"{table['head']} K={table['k']}, head.compute_match={table['compute_match']}"),
        ("blocks", f"{table['blocks_trunk']} trunk + {table['blocks_head']} head = {table['blocks_total']} "
                   f"(next-token path {table['blocks_next_token_path']})"),
        ("parameters", f"{table['params_total']:,} (trunk blocks {table['params_trunk']:,}, head {table['params_head_private']:,}, "
                       f"embedding/norm/unembedding {table['params_shared']:,})"),
        ("FLOPs/token", f"{table['train_flops_per_token'] / 1e6:,.2f} M (training: forward + backward, seq_len {table['seq_len']})"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {text}" for name, text in rows)

"""The runtime ledger of speculative decoding (M7.6 §0x0A, M7.4 §0x09), from `Generation.stats`.

Per round: R = tokens emitted (the incoming frontier is not counted again). Away from
EOS/budget stops, a round with m drafts of which j pass emits R = j + 1, so
mean R = 1 + mean accepted per round; for one proposal (DeepSeek D = 1) that is
1 + acceptance rate. The predicted speedup uses measured mean costs:

    S = E[R] · C_main / (C_draft + C_verify)

with C_main the mean time of one plain cached step of the same model (one target pass
over one token), C_draft and C_verify this run's mean draft and verification time per round.
"""

from __future__ import annotations


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def decode_rate(stats: dict) -> float:
    """Tokens per second after prefill (the first token is the prefill's)."""
    seconds = stats["total_time_s"] - stats["prefill_time_s"]
    return (stats["emitted"] - 1) / seconds if seconds > 0 and stats["emitted"] > 1 else float("nan")


def ledger(stats: dict, plain: dict | None = None) -> dict:
    """Aggregates of one run's stats (or of `merge`d stats); with `plain` stats, the speedups."""
    nonterminal = [i for i, stopped in enumerate(stats["stopped_by_round"]) if not stopped]
    proposed, accepted = stats["proposed_by_position"], stats["accepted_by_position"]
    rounds = max(stats["rounds"], 1)
    out = {
        "rounds": stats["rounds"],
        "target_forwards": stats["target_forwards"],
        "tokens_per_forward": stats["emitted"] / stats["target_forwards"] if stats["target_forwards"] else float("nan"),
        "accept_by_position": [a / p if p else float("nan") for a, p in zip(accepted, proposed)],
        "mean_R": _mean(stats["emitted_by_round"][i] for i in nonterminal),
        "one_plus_mean_accepted": 1 + _mean(stats["accepted_by_round"][i] for i in nonterminal),
        "draft_s_per_round": stats["draft_time_s"] / rounds,
        "verify_s_per_round": stats["verify_time_s"] / rounds,
        "fallbacks": stats["fallbacks"],
        "kv_bytes": stats["kv_bytes"],
    }
    if plain is not None:
        c_main = plain["verify_time_s"] / max(plain["rounds"], 1)
        out["predicted_speedup"] = out["mean_R"] * c_main / (out["draft_s_per_round"] + out["verify_s_per_round"])
        out["measured_speedup"] = decode_rate(stats) / decode_rate(plain)
    return out


def merge(runs: list[dict]) -> dict:
    """Sum the counters and times of several requests' stats (per-request lists are concatenated)."""
    merged = {key: value for key, value in runs[0].items()}
    for stats in runs[1:]:
        for key, value in stats.items():
            if isinstance(value, bool) or key in ("tokens_per_s", "tokens_per_forward"):
                continue
            if isinstance(value, (int, float)):
                merged[key] = merged[key] + value
            elif isinstance(value, list):
                merged[key] = [a + b for a, b in zip(merged[key], value)] if key.endswith("_by_position") else merged[key] + value
            elif isinstance(value, dict):
                merged[key] = {k: max(merged[key][k], v) for k, v in value.items()}  # peaks
    return merged


def ledger_line(stats: dict) -> str:
    led = ledger(stats)
    accept = ",".join(f"{a:.2f}" for a in led["accept_by_position"])
    kv = led["kv_bytes"]
    return (
        f"rounds: {led['rounds']}  tokens/forward: {led['tokens_per_forward']:.2f}  accept by position: [{accept}]  "
        f"mean R: {led['mean_R']:.3f} (1+accepted: {led['one_plus_mean_accepted']:.3f})  "
        f"draft s/round: {led['draft_s_per_round'] * 1e3:.2f} ms  verify s/round: {led['verify_s_per_round'] * 1e3:.2f} ms  "
        f"fallbacks: {led['fallbacks']}  kv bytes target/draft/branch: {kv['target']}/{kv['draft']}/{kv['branch_peak']}"
    )

"""The runtime ledger of speculative decoding (docs/decoding.md), from `Generation.stats`.

Per round: R = tokens emitted (the incoming frontier is not counted again). Away from
EOS/budget stops, a round with m drafts of which j pass emits R = j + 1, so
mean R = 1 + mean accepted per round; for one proposal (DeepSeek D = 1) that is
1 + acceptance rate. The predicted speedup uses measured mean costs:

    S = E[R] · C_main / (C_draft + C_verify)

with C_main the mean time of one plain cached step of the same model (one target pass
over one token), C_draft and C_verify this run's mean draft and verification time per round.

Acceptance conventions (the field uses both; `acceptance_conventions` gives each by name).
A round proposes m drafts and accepts a prefix of a ≤ m of them; position j is *offered*
in a round when m ≥ j.

    accept_by_position[j]       P(a ≥ j | j offered): vLLM's per-position rate (accepted ÷ drafted at j)
    reach_by_position[j]        P(a ≥ j) over every verification round (m ≥ 1): how often the accepted
                                prefix reaches j. Non-increasing in j for any proposer. With a fixed
                                draft length it equals the rate above; with a variable one (prompt
                                lookup drafts only as far as its match goes) the rate above can rise with
                                j, since only long matches offer far positions, and this one cannot
    accept_cond_by_position[j]  P(a ≥ j | j offered, a ≥ j−1): conditional, vLLM speculators'
    mean_accepted               mean a per verification round (the bonus/correction excluded)
    mean_accept_len             1 + mean_accepted: tokens a verification yields, the bonus or
                                correction included (vLLM's and Spec-Bench's τ; 1.00 plain)

Both means count the token each verification yields even where EOS or the output budget
cut the round's output short (that is `mean_R`'s business, which leaves such rounds out).

Path acceptance and its Fréchet bounds (docs/decoding.md). Over the *checked* rounds (every one
of the K−1 draft slots offered and inside the output), a_j is how often the rank-0 draft of
position j equals the token emitted there, whatever happened at the other positions: the
per-horizon correctness events. Without a model of their dependence,

    max(0, Σ_j a_j − (K−1) + 1)  ≤  P(all K−1 rank-0 drafts right)  ≤  min_j a_j

and the measured `top1_all` must lie inside. `path_accept` is how often the accepted path
reached the full depth in those rounds. A chain accepts exactly the right rank-0 drafts (a
rejected draft is never the emitted token, greedy or sampled), so for a chain
path_accept = top1_all; a tree's path may take candidates of rank ≥ 1 and can exceed the
upper bound: that surplus is the tree's gain.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


@dataclass
class RoundLedger:
    """One request's rounds, counted alike by every decoder (single, batched plain, batched speculative).

    `count_round` takes each round; `record_path` remembers a drafting round's rank-0 drafts for the path
    counters; `stats(out)` gives the counters in `Generation.stats`' schema, which `ledger` and `merge` read.
    A decoder adds what else it measures (times, trees, lookup) beside them.
    """

    max_drafts: int
    target_forwards: int = 0
    rounds: int = 0
    fallbacks: int = 0  # drafting rounds that had no slot or no draft and stepped plainly
    proposed_by_position: list[int] = field(init=False)
    accepted_by_position: list[int] = field(init=False)
    emitted_by_round: list[int] = field(default_factory=list)
    proposed_by_round: list[int] = field(default_factory=list)
    accepted_by_round: list[int] = field(default_factory=list)
    stopped_by_round: list[bool] = field(default_factory=list)
    path_rounds: list[tuple[int, list[int], int]] = field(default_factory=list)  # (frontier's output index, rank-0 drafts, accepted)

    def __post_init__(self) -> None:
        self.proposed_by_position, self.accepted_by_position = [0] * self.max_drafts, [0] * self.max_drafts

    def count_round(self, proposed: int, accepted: int, emitted: int, stopped: bool) -> None:
        """`proposed` drafts offered, the first `accepted` of them kept, `emitted` tokens published, `stopped` when the
        request ended with this round (EOS or its budget)."""
        self.rounds += 1
        for j in range(proposed):
            self.proposed_by_position[j] += 1
            self.accepted_by_position[j] += int(j < accepted)
        self.emitted_by_round.append(emitted), self.proposed_by_round.append(proposed), self.accepted_by_round.append(accepted)
        self.stopped_by_round.append(stopped)

    def record_path(self, start: int, top1: list[int], accepted: int) -> None:
        """A drafting round: output index of its frontier, its rank-0 drafts, the accepted path's length."""
        self.path_rounds.append((start, top1, accepted))

    def stats(self, out: list[int]) -> dict:
        """The counters for output `out`, both acceptance conventions and tokens per target forward; for a drafting
        decoder (max_drafts ≥ 1) the path counters and their Fréchet bounds."""
        stats = {"target_forwards": self.target_forwards, "rounds": self.rounds, "emitted": len(out), "fallbacks": self.fallbacks,
                 **{name: list(getattr(self, name)) for name in ROUND_LISTS},
                 "tokens_per_forward": len(out) / self.target_forwards if self.target_forwards else float("nan"),
                 **acceptance_conventions(self.proposed_by_round, self.accepted_by_round, self.max_drafts)}
        if self.max_drafts:
            stats.update(path_counters(self.path_rounds, out, self.max_drafts))
            stats.update(path_bounds(stats))
        return stats


ROUND_LISTS = ("proposed_by_position", "accepted_by_position", "emitted_by_round", "proposed_by_round", "accepted_by_round", "stopped_by_round")


def decode_rate(stats: dict) -> float:
    """Tokens per second after prefill (the first token is the prefill's)."""
    seconds = stats["total_time_s"] - stats["prefill_time_s"]
    return (stats["emitted"] - 1) / seconds if seconds > 0 and stats["emitted"] > 1 else float("nan")


def acceptance_conventions(proposed_by_round: list[int], accepted_by_round: list[int], positions: int | None = None) -> dict:
    """Per-position acceptance both ways (positions 1..`positions`, default the most offered) and both mean lengths."""
    positions = max(proposed_by_round, default=0) if positions is None else positions
    offered = [[a for m, a in zip(proposed_by_round, accepted_by_round) if m >= j] for j in range(1, positions + 1)]
    rate = lambda hits, total: hits / total if total else float("nan")  # noqa: E731
    unconditional = [rate(sum(a >= j for a in rounds), len(rounds)) for j, rounds in enumerate(offered, start=1)]
    conditional = [rate(sum(a >= j for a in rounds), sum(a >= j - 1 for a in rounds)) for j, rounds in enumerate(offered, start=1)]
    verified = [a for m, a in zip(proposed_by_round, accepted_by_round) if m >= 1]
    reach = [rate(sum(a >= j for a in verified), len(verified)) for j in range(1, positions + 1)]
    mean_accepted = _mean(accepted_by_round) if accepted_by_round else 0.0
    return {
        "accept_by_position": unconditional,
        "reach_by_position": reach,
        "accept_cond_by_position": conditional,
        "mean_accepted": mean_accepted,
        "mean_accept_len": 1.0 + mean_accepted,
    }


def path_counters(path_rounds: list[tuple[int, list[int], int]], out: list[int], max_drafts: int) -> dict:
    """The checked rounds' counters (`top1_*` and `path_*`, summable across requests) from `RoundLedger.path_rounds`."""
    match, checked, every, full = [0] * max_drafts, 0, 0, 0
    for start, top1, accepted in path_rounds:
        if len(top1) < max_drafts or start + max_drafts >= len(out):
            continue  # a shortened round, or a draft slot past the output's end (budget or EOS)
        hits = [top1[j] == out[start + 1 + j] for j in range(max_drafts)]  # slot j + 1 after the frontier
        match = [m + h for m, h in zip(match, hits)]
        checked, every, full = checked + 1, every + all(hits), full + (accepted == max_drafts)
    return {"top1_match_by_position": match, "top1_checked_rounds": checked, "top1_all_match": every, "path_full_accepted": full}


def path_bounds(stats: dict) -> dict:
    """From the counters: `path_accept`, `top1_by_position` (a_j), `top1_all` and the Fréchet bounds on it."""
    n = stats.get("top1_checked_rounds", 0)
    if not n:
        nan = float("nan")
        return {"path_accept": nan, "top1_by_position": [], "top1_all": nan, "frechet_lower": nan, "frechet_upper": nan}
    a = [m / n for m in stats["top1_match_by_position"]]
    return {"path_accept": stats["path_full_accepted"] / n, "top1_by_position": a, "top1_all": stats["top1_all_match"] / n,
            "frechet_lower": max(0.0, sum(a) - len(a) + 1), "frechet_upper": min(a)}


def ledger(stats: dict, plain: dict | None = None) -> dict:
    """Aggregates of one run's stats (or of `merge`d stats); with `plain` stats, the speedups."""
    nonterminal = [i for i, stopped in enumerate(stats["stopped_by_round"]) if not stopped]
    rounds = max(stats["rounds"], 1)
    out = {
        "rounds": stats["rounds"],
        "target_forwards": stats["target_forwards"],
        "tokens_per_forward": stats["emitted"] / stats["target_forwards"] if stats["target_forwards"] else float("nan"),
        **acceptance_conventions(stats["proposed_by_round"], stats["accepted_by_round"], len(stats["proposed_by_position"])),
        "mean_R": _mean(stats["emitted_by_round"][i] for i in nonterminal),
        "one_plus_mean_accepted": 1 + _mean(stats["accepted_by_round"][i] for i in nonterminal),
        "draft_s_per_round": stats["draft_time_s"] / rounds,
        "verify_s_per_round": stats["verify_time_s"] / rounds,
        "fallbacks": stats["fallbacks"],
        "kv_bytes": stats["kv_bytes"],
        **path_bounds(stats),
    }
    out["by_drafter"] = by_drafter(stats)
    if plain is not None:
        c_main = plain["verify_time_s"] / max(plain["rounds"], 1)
        out["predicted_speedup"] = out["mean_R"] * c_main / (out["draft_s_per_round"] + out["verify_s_per_round"])
        out["measured_speedup"] = decode_rate(stats) / decode_rate(plain)
    return out


def by_drafter(stats: dict) -> dict:
    """Per drafter of a round (lookup, heads, both, none: `drafter_by_round`): its rounds, share of rounds, and mean
    drafts proposed and accepted per round."""
    names = stats.get("drafter_by_round") or []
    out = {}
    for name in sorted(set(names)):
        rounds = [i for i, who in enumerate(names) if who == name]
        out[name] = {"rounds": len(rounds), "share": len(rounds) / len(names),
                     "mean_proposed": _mean(stats["proposed_by_round"][i] for i in rounds),
                     "mean_accepted": _mean(stats["accepted_by_round"][i] for i in rounds)}
    return out


# Per-request ratios: not summed; `merge` recomputes the acceptance conventions from the rounds.
RATES = ("tokens_per_s", "tokens_per_forward", "accept_by_position", "reach_by_position", "accept_cond_by_position", "mean_accepted", "mean_accept_len",
         "path_accept", "top1_by_position", "top1_all", "frechet_lower", "frechet_upper")


def merge(runs: list[dict]) -> dict:
    """Sum the counters and times of several requests' stats (per-request lists are concatenated)."""
    merged = {key: value for key, value in runs[0].items()}
    for stats in runs[1:]:
        for key, value in stats.items():
            if isinstance(value, bool) or key in RATES:
                continue
            if isinstance(value, (int, float)):
                merged[key] = merged[key] + value
            elif isinstance(value, list):
                merged[key] = [a + b for a, b in zip(merged[key], value)] if key.endswith("_by_position") else merged[key] + value
            elif isinstance(value, dict):
                merged[key] = {k: max(merged[key][k], v) for k, v in value.items()}  # peaks
    if "proposed_by_round" in merged:
        merged.update(acceptance_conventions(merged["proposed_by_round"], merged["accepted_by_round"], len(merged["proposed_by_position"])))
    if "top1_checked_rounds" in merged:
        merged.update(path_bounds(merged))
    return merged


def ledger_line(stats: dict) -> str:
    led = ledger(stats)
    reach = ",".join(f"{a:.2f}" for a in led["reach_by_position"])
    accept = ",".join(f"{a:.2f}" for a in led["accept_by_position"])
    conditional = ",".join(f"{a:.2f}" for a in led["accept_cond_by_position"])
    kv = led["kv_bytes"]
    agree = ",".join(f"{a:.2f}" for a in led["top1_by_position"])
    return (
        f"rounds: {led['rounds']}  tokens/forward: {led['tokens_per_forward']:.2f}  P(prefix>=j): [{reach}]  "
        f"accept rate at j of rounds drafting j: [{accept}]  "
        f"P(j | 1..j-1): [{conditional}]  mean accept len (with bonus): {led['mean_accept_len']:.3f}  "
        f"mean R: {led['mean_R']:.3f} (1+accepted: {led['one_plus_mean_accepted']:.3f})  "
        f"draft s/round: {led['draft_s_per_round'] * 1e3:.2f} ms  verify s/round: {led['verify_s_per_round'] * 1e3:.2f} ms  "
        f"fallbacks: {led['fallbacks']}  kv bytes target/draft/branch: {kv['target']}/{kv['draft']}/{kv['branch_peak']}  "
        f"path accept: {led['path_accept']:.2f}  top-1 agreement by position: [{agree}]  all: {led['top1_all']:.2f} "
        f"in [{led['frechet_lower']:.2f}, {led['frechet_upper']:.2f}] (Fréchet)  tree nodes/round: {stats['tree_nodes'] / max(stats['rounds'], 1):.1f}"
        + drafters_text(led["by_drafter"])
    )


def drafters_text(drafters: dict) -> str:
    """`  drafters: lookup 62% (3.1 → 2.4), heads 38% (4.0 → 0.6)` (drafted → accepted per round); '' with one drafter."""
    if len(drafters) < 2:
        return ""
    parts = [f"{name} {d['share']:.0%} ({d['mean_proposed']:.1f} → {d['mean_accepted']:.1f})" for name, d in drafters.items()]
    return "  drafters: " + ", ".join(parts)

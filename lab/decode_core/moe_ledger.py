"""The runtime ledger of an MoE model's speculative decoding (docs/moe.md): which experts a round touches.

`MoELedger(model)` is entered around `generate(...)`. Through the router hooks of lab/nn/moe.py (`RouterTap`) it
records every router call and splits them into rounds: the trunk routers run once per target pass (the prefill, then
one verification pass per round); the head routers (the MTP depths) run while drafting and while a depth catches up on
the rows a verification accepted. A round is the head calls since the previous target pass plus its target pass, so
a round's draft is what produced the drafts that pass verified.

Per round and per router: the distinct experts its rows chose (a verification over r rows touches up to min(E, k·r)
experts: unlike a dense layer, its weight traffic grows with r), and the routed-expert weight bytes those imply
(distinct experts × one expert's bytes; shared experts are read whatever the route, listed apart). Per MTP depth:
its module time (wall and per-thread CPU, forward hooks on the depth module) and the KV bytes its cache holds at the
end (the decoder's `kv_bytes_by_cache`, cache ("step", d)). An MLA depth caches per row its compressed latent and its rotary key
(kv_lora_rank + qk_rope_head_dim values), counted at their own widths.

The cost model (`cost_model`) puts an expert term into the round cost of the ledger (lab/decode_core/ledger.py):

    C_round ≈ C_mtp + C_verify,   C_verify ≈ c_0 + expert_bytes_verify / β

with c_0 and β fitted by least squares over this run's verification passes (β: the bytes per second the expert
term implies); it is printed next to the measured mean round cost, with the expert term's share.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from lab.nn.moe import RouterPlace, RouterTap, router_places


def expert_bytes(model, place: RouterPlace) -> tuple[int, int]:
    """(bytes of one routed expert, bytes of the shared experts) of the MoE block whose router is `place`."""
    block = next(module for module in model.modules() if getattr(module, "gate", None) is place.module)
    routed = sum(p.numel() * p.element_size() for p in block.experts.parameters()) // place.n_experts
    shared = getattr(block, "shared_experts", None)
    return routed, sum(p.numel() * p.element_size() for p in shared.parameters()) if shared is not None else 0


@dataclass
class RoundRouting:
    """One round: per router place, distinct experts chosen and the rows routed; the target pass's rows."""

    verify_rows: int
    distinct: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)


class DepthTimer:
    """Wall and per-thread CPU seconds spent inside each MTP depth module (forward pre/post hooks)."""

    def __init__(self, model):
        self.modules = list(getattr(model.head, "depth_modules", []))
        self.wall = [0.0] * len(self.modules)
        self.cpu = [0.0] * len(self.modules)
        self.calls = [0] * len(self.modules)
        self._handles, self._start = [], {}

    def __enter__(self):
        for d, module in enumerate(self.modules):
            self._handles.append(module.register_forward_pre_hook(lambda m, a, d=d: self._begin(d)))
            self._handles.append(module.register_forward_hook(lambda m, a, o, d=d: self._end(d)))
        return self

    def _begin(self, d):
        self._start[d] = (time.perf_counter(), time.thread_time())

    def _end(self, d):
        wall, cpu = self._start.pop(d)
        self.wall[d] += time.perf_counter() - wall
        self.cpu[d] += time.thread_time() - cpu
        self.calls[d] += 1

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []


class PassTimer:
    """Per-thread CPU seconds of each target pass (hooks on the trunk module), in call order, and where each pass
    begins in the router record stream with its rows: rounds are delimited by the trunk's own forward, so a dense
    trunk under MoE depths still has rounds."""

    def __init__(self, module, tap: RouterTap):
        self.module, self.tap, self.seconds, self.starts, self._handles, self._start = module, tap, [], [], [], 0.0

    def __enter__(self):
        self._handles = [self.module.register_forward_pre_hook(lambda m, a: self._begin(a[0])),
                         self.module.register_forward_hook(lambda m, a, o: self.seconds.append(time.thread_time() - self._start))]
        return self

    def _begin(self, tokens: torch.Tensor):
        self.starts.append((len(self.tap.records), tokens.numel()))  # [B, S] tokens: the pass's rows
        self._start = time.thread_time()

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []


def fit_expert_term(expert_bytes: list[float], seconds: list[float]) -> tuple[float, float]:
    """(c_0 s, s per byte) of seconds ≈ c_0 + bytes · slope, least squares; slope 0 when every pass read the same bytes."""
    x = torch.tensor(expert_bytes, dtype=torch.float64)
    y = torch.tensor(seconds, dtype=torch.float64)
    if len(x) < 2 or float(x.var(correction=0)) == 0.0:
        return float(y.mean()) if len(y) else float("nan"), 0.0
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum())
    return float(y.mean()) - slope * float(x.mean()), slope


class MoELedger:
    """Enter around `generate(model, …)`; `report(generation.stats)` gives the per-round expert ledger."""

    def __init__(self, model):
        self.model = model
        self.places = router_places(model)
        self.trunk_places = [p for p in self.places if p.place.startswith("l")]
        self.bytes = {p.place: expert_bytes(model, p) for p in self.places}
        self.tap, self.timer = RouterTap(self.places), DepthTimer(model)
        self.pass_timer = PassTimer(model.trunk, self.tap)  # entered after the tap, which starts its records afresh

    def __enter__(self) -> "MoELedger":
        for part in (self.tap, self.timer, self.pass_timer):
            part.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for part in (self.tap, self.timer, self.pass_timer):
            part.__exit__(*exc)

    def passes(self) -> list[RoundRouting]:
        """Round 0 is the prefill; round r ≥ 1 holds the head calls before target pass r and that pass."""
        rounds, pending, seen = [], {}, {}
        starts, records = list(self.pass_timer.starts), self.tap.records
        for index in range(len(records) + 1):
            while starts and starts[0][0] == index:  # a target pass begins: the drafting since the last one is its round's
                target = RoundRouting(starts.pop(0)[1])
                for head_place, experts in seen.items():
                    target.distinct[head_place], target.rows[head_place] = len(experts), pending[head_place]
                seen, pending = {}, {}
                rounds.append(target)
            if index == len(records):
                break
            record, chosen = records[index], set(records[index].chosen.reshape(-1).tolist())
            place = record.place.place
            if place.startswith("l"):  # each trunk router runs once per target pass
                rounds[-1].distinct[place], rounds[-1].rows[place] = len(chosen), record.chosen.shape[0]
            else:  # a head call: it belongs to the round whose target pass comes next
                seen.setdefault(place, set()).update(chosen)
                pending[place] = pending.get(place, 0) + record.chosen.shape[0]
        return rounds

    def round_bytes(self, routing: RoundRouting, heads: bool) -> int:
        """Routed-expert bytes the round's verification (heads=False) or drafting (heads=True) touches."""
        return sum(n * self.bytes[place][0] for place, n in routing.distinct.items() if place.startswith("h") == heads)

    def report(self, stats: dict) -> dict:
        rounds = self.passes()[1:]  # the prefill apart
        n = max(len(rounds), 1)
        depths = len(self.timer.modules)
        kv = stats.get("kv_bytes_by_cache", {})
        return {
            "rounds": len(rounds),
            "verify_rows_mean": sum(r.verify_rows for r in rounds) / n,
            "distinct_experts_mean": {p.place: sum(r.distinct.get(p.place, 0) for r in rounds) / n for p in self.places},
            "expert_bytes_verify_mean": sum(self.round_bytes(r, False) for r in rounds) / n,
            "expert_bytes_draft_mean": sum(self.round_bytes(r, True) for r in rounds) / n,
            "expert_bytes_one_row": sum(p.top_k * self.bytes[p.place][0] for p in self.trunk_places),
            "shared_expert_bytes": sum(shared for _, shared in self.bytes.values()),
            "mtp_time_s": {f"d{d + 1}": self.timer.wall[d] for d in range(depths)},
            "mtp_cpu_s": {f"d{d + 1}": self.timer.cpu[d] for d in range(depths)},
            "mtp_kv_bytes": {f"d{d + 1}": kv.get(str(("step", d + 1)), 0) for d in range(depths)},
            "per_round": rounds,
            "cost": self.cost_model(rounds),
        }

    def cost_model(self, rounds: list[RoundRouting]) -> dict:
        """Mean round cost (per-thread CPU s): measured (MTP depth time + target pass) and the model's prediction
        C_mtp + c_0 + expert_bytes_verify · slope, with the expert term's mean share."""
        verify = self.pass_timer.seconds[1:1 + len(rounds)]  # the prefill apart
        n = max(len(verify), 1)
        bytes_verify = [float(self.round_bytes(r, False)) for r in rounds[:len(verify)]]
        c0, slope = fit_expert_term(bytes_verify, verify)
        mtp = sum(self.timer.cpu) / n
        expert = slope * sum(bytes_verify) / n
        return {"measured_s": mtp + sum(verify) / n, "mtp_s": mtp, "verify_fixed_s": c0, "expert_term_s": expert,
                "predicted_s": mtp + c0 + expert, "seconds_per_expert_byte": slope}


def ledger_line(report: dict) -> str:
    """One line of the MoE ledger beside the measured round cost."""
    cost, ms = report["cost"], 1e3
    experts = ", ".join(f"{place} {n:.2f}" for place, n in report["distinct_experts_mean"].items())
    rounds = max(report["rounds"], 1)
    depths = ", ".join(f"{d} {t * ms / rounds:.2f} ms/round, KV {report['mtp_kv_bytes'][d] / 1024:.1f} KiB" for d, t in report["mtp_cpu_s"].items())
    return (f"MoE rounds {report['rounds']}: verify rows {report['verify_rows_mean']:.2f}; distinct experts per round {experts}; "
            f"expert bytes verify {report['expert_bytes_verify_mean'] / 1024:.1f} KiB (one row {report['expert_bytes_one_row'] / 1024:.1f}), "
            f"draft {report['expert_bytes_draft_mean'] / 1024:.1f} KiB; MTP {depths or 'none'}; cost model "
            f"C_mtp {cost['mtp_s'] * ms:.2f} + c_0 {cost['verify_fixed_s'] * ms:.2f} + expert term {cost['expert_term_s'] * ms:.2f} "
            f"= {cost['predicted_s'] * ms:.2f} ms vs measured {cost['measured_s'] * ms:.2f} ms per round (CPU time)")

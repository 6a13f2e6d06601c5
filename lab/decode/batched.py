"""Batched requests: B prompts of different lengths decoded together, one `Generation` per prompt.

Prompts are left-padded to a common length P, so every row appends its new token at the same
cache slot and one forward serves all rows. Row b's padding occupies slots 0..pad_b−1; its
token at slot s has position s − pad_b (positions start at 0 at each prompt's first token, as
for a single request), and its queries see only its own slots ≥ pad_b. A row that has stopped
(EOS, its budget or its stop predicate) leaves the batch: its cache rows are dropped and the
others' steps get cheaper. Speculative batches: lab.decode.batched_speculative.

Each row's law is that of a single request: its next token is drawn from softmax(its own
logits / T) (top-k), independently of the other rows; greedy rows equal single greedy decoding,
and with one generator per prompt sampled rows equal single requests with those generators.
"""

from __future__ import annotations

import time

import torch

from lab.errors import require
from lab.decode_core.cache import StackCache
from lab.decode_core.hf_cache import HFTrunkCache
from lab.decode_core.ledger import RoundLedger
from lab.decode_core.sampling import TokenChooser
from lab.decode_core.target import TRUNK
from lab.nn.blocks import AttentionContext, rotary_angles


class BatchedCaches:
    """K/V of B rows for every stack a forward touches, in slots shared by all rows; per-row masks and positions.

    Every forward appends the same number of slots to every row. A slot a row does not keep
    (left padding, a rejected draft) stays in the buffers as a hole that the row's queries never
    see; positions count only the slots a row keeps, so row b's tokens sit at 0, 1, 2, … as in a
    single request.
    """

    any_requests = True  # prompts of any lengths, plain or speculative

    def __init__(self, model, batch: int, device):
        cfg = model.trunk.cfg  # width, heads and rotary base of the head stacks (a transformers trunk derives them from its config)
        self.head_dim, self.rope_base = cfg.d_model // cfg.n_heads, cfg.rope_base
        self.caches: dict = {}
        self.valid = torch.zeros(batch, 0, dtype=torch.bool, device=device)  # [B, L] slots each row keeps
        self.next_position = torch.zeros(batch, dtype=torch.long, device=device)  # [B]
        self.peak_bytes = 0

    @property
    def length(self) -> int:
        return self.valid.shape[1]

    def contexts(self, new_valid: torch.Tensor):
        """`ctx_for(key)` for one forward over new slots (new_valid [B, n]: which are the row's tokens); one mask, one rotary table."""
        n = new_valid.shape[1]
        positions = (self.next_position[:, None] + new_valid.long().cumsum(1) - 1).clamp_min(0)  # [B, n]: holes at 0
        cos, sin = rotary_angles(positions, self.head_dim, self.rope_base)  # [B, 1, n, hd/2] each
        keys = torch.cat([self.valid, new_valid], dim=1)  # [B, L]
        slots = torch.arange(self.length + n, device=keys.device)  # [L]
        queries = slots[self.length :]  # [n]
        causal = slots[None, :] <= queries[:, None]  # [n, L]
        diagonal = slots[None, :] == queries[:, None]  # [n, L]: keeps a hole's softmax finite (its output is never used)
        mask = ((keys[:, None, :] & causal[None]) | diagonal[None])[:, None]  # [B, 1, n, L]
        return lambda key: AttentionContext(mask, cos, sin, kv=self.caches.setdefault(key, StackCache(key, "target")))

    def keep_rows(self, index: torch.Tensor) -> None:
        """Go on with batch rows `index` [b'] only (the others' requests have finished)."""
        self.valid, self.next_position = self.valid[index], self.next_position[index]  # [b', L], [b']
        for cache in self.caches.values():
            cache.select_rows(index)

    def advance(self, keep: torch.Tensor) -> None:
        """Keep [B, n] of the slots the last forward appended (the rest become holes)."""
        self.valid = torch.cat([self.valid, keep], dim=1)  # [B, L + n]
        self.next_position += keep.long().sum(1)
        for cache in self.caches.values():
            cache.commit()
        self.peak_bytes = max(self.peak_bytes, sum(c.length * c.row_bytes() for c in self.caches.values()))


class SameLengthHFCaches(BatchedCaches):
    """A transformers trunk's batch (model=hf): rows of one prompt length, the trunk's K/V in transformers' own
    DynamicCache, a head's own blocks (a parallel head's next-token stack) in the harness's caches.

    Every row keeps every slot (no left padding, no holes), so transformers builds the trunk's causal mask
    and positions itself, as in its own batched generate. Used for n samples of one prompt (pass@k);
    prompts of different lengths need the harness's GPT trunk.
    """

    any_requests = False  # plain requests of one prompt length only

    def __init__(self, model, batch: int, device):
        super().__init__(model, batch, device)
        self.trunk_cache = HFTrunkCache(TRUNK, "target")

    def contexts(self, new_valid: torch.Tensor):
        require(bool(new_valid.all()), "prompt",
                "a transformers trunk (model=hf) batches prompts of one length only; pass prompts of different lengths one at a time")
        native = super().contexts(new_valid)  # head blocks: the harness's mask and rotary angles over the same slots
        trunk = AttentionContext(None, None, None, kv=self.trunk_cache)
        return lambda key: trunk if key == TRUNK else native(key)

    def keep_rows(self, index: torch.Tensor) -> None:
        super().keep_rows(index)
        self.trunk_cache.dynamic.batch_select_indices(index)

    def advance(self, keep: torch.Tensor) -> None:
        self.trunk_cache.commit()
        super().advance(keep)
        self.peak_bytes = max(self.peak_bytes, self.trunk_cache.length * self.trunk_cache.row_bytes()
                              + sum(c.length * c.row_bytes() for c in self.caches.values()))


# The batch caches for each trunk cache protocol (the trunk's `cache_protocol`).
BATCH_CACHES: dict[str, type[BatchedCaches]] = {"stack": BatchedCaches, "dynamic": SameLengthHFCaches}


def batch_cache_class(model) -> type[BatchedCaches]:
    """The caches a batch decodes with: the GPT trunk's per-row slots, or transformers' DynamicCache."""
    return BATCH_CACHES[model.trunk.cache_protocol]


def batch_caches(model, batch: int, device):
    return batch_cache_class(model)(model, batch, device)


def left_padded(rows: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, P] (token 0 in the padding) and which slots are the prompts' tokens [B, P]."""
    width = max(r.numel() for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)  # [B, P]
    valid = torch.zeros(len(rows), width, dtype=torch.bool, device=device)  # [B, P]
    for b, row in enumerate(rows):
        ids[b, width - row.numel() :] = row.to(device)  # [P_b] right-aligned
        valid[b, width - row.numel() :] = True
    return ids, valid


def batched_rows(model, caches: BatchedCaches, ids: torch.Tensor, new_valid: torch.Tensor):
    """One forward of ids [B, n] at the next slots: horizon rows [B, n, d] for 1, 2, … (lazy; the caller advances)."""
    ctx_for = caches.contexts(new_valid)
    hidden = model.trunk(ids, ctx_for(TRUNK))  # [B, n, d]
    return model.head.horizon_rows(hidden, ctx_for)


def batched_logits(model, caches: BatchedCaches, ids: torch.Tensor, new_valid: torch.Tensor) -> torch.Tensor:
    """Plain step: ids [B, n] -> [B, V] next-token logits at each row's last new slot (draft stacks never run)."""
    rows = next(batched_rows(model, caches, ids, new_valid))  # [B, n, d] horizon 1
    caches.advance(new_valid)
    return model.horizon_logits(1, rows[:, -1])  # [B, V]


def decode_rows(model, rows: list[torch.Tensor], max_new_tokens: int, choosers: list[TokenChooser], eos: int | None,
                stop=None) -> list[tuple[list[int], dict]]:
    """Plain decoding of B rows; row b draws from choosers[b] (rows in order, each step).

    `stop(out) -> bool` (optional): a row also ends once it says True of the row's tokens so far
    (e.g. a stop sequence in their text); the tokens before that point are those of a run without it.
    """
    device = next(model.parameters()).device
    ids, prompt_valid = left_padded(rows, device)  # [B, P] each
    caches = batch_caches(model, len(rows), device)
    outputs: list[list[int]] = [[] for _ in rows]
    done = lambda out: len(out) == max_new_tokens or (bool(out) and (out[-1] == eos or (stop is not None and stop(out))))  # noqa: E731
    begin = time.perf_counter()
    prefill_s, forwards = 0.0, 0
    if max_new_tokens > 0:
        logits = batched_logits(model, caches, ids, prompt_valid)  # prefill: [B, V]
        forwards, prefill_s = 1, time.perf_counter() - begin
        active = list(range(len(rows)))  # the requests still decoding; logits row i belongs to request active[i]
        while True:
            for i, b in enumerate(active):
                outputs[b].append(choosers[b].choose(logits[i])[0])
            going = [i for i, b in enumerate(active) if not done(outputs[b])]
            if not going:
                break
            if len(going) < len(active):  # finished requests leave the batch: the others' steps get cheaper
                caches.keep_rows(torch.tensor(going, device=device))
                active = [active[i] for i in going]
            tokens = torch.tensor([[outputs[b][-1]] for b in active], device=device)  # [b', 1]
            logits = batched_logits(model, caches, tokens, torch.ones(len(active), 1, dtype=torch.bool, device=device))  # [b', V]
            forwards += 1
    elapsed = time.perf_counter() - begin
    shared = {"target_forwards": forwards, "prefill_time_s": prefill_s, "total_time_s": elapsed, "batch_size": len(rows),
              "batch_tokens_per_s": sum(map(len, outputs)) / elapsed if elapsed > 0 else float("nan"),
              "kv_bytes": {"target": caches.peak_bytes, "draft": 0, "branch_peak": 0}}
    return [(out, row_stats(out, shared)) for out in outputs]


def row_stats(out: list[int], shared: dict) -> dict:
    """One request's stats in the single-request schema; forwards, times and cache bytes are the batch's (shared)."""
    rounds = max(len(out) - 1, 0)  # plain decoding: one token per forward after the prefill's
    elapsed = shared["total_time_s"]
    ledger = RoundLedger(0, target_forwards=shared["target_forwards"])
    for i in range(rounds):
        ledger.count_round(proposed=0, accepted=0, emitted=1, stopped=i == rounds - 1)
    return {**shared, **ledger.stats(out), "draft_time_s": 0.0, "verify_time_s": elapsed - shared["prefill_time_s"],
            "tokens_per_s": len(out) / elapsed if elapsed > 0 else float("nan")}

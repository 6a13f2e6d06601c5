"""Batched requests: B prompts of different lengths decoded together, one `Generation` per prompt.

Prompts are left-padded to a common length P, so every row appends its new token at the same
cache slot and one forward serves all rows. Row b's padding occupies slots 0..pad_b−1; its
token at slot s has position s − pad_b (positions start at 0 at each prompt's first token, as
for a single request), and its queries see only its own slots ≥ pad_b. A row that has stopped
(EOS or its budget) keeps riding along until every row has stopped; its later tokens are
dropped. Plain decoding only: speculative rounds accept a different number of drafts per row,
which needs per-row cache lengths (speculative=True with several prompts is refused).

Each row's law is that of a single request: its next token is drawn from softmax(its own
logits / T) (top-k), independently of the other rows; greedy rows equal single greedy decoding.
"""

from __future__ import annotations

import time

import torch

from lab.decode.cache import StackCache
from lab.decode.ledger import acceptance_conventions
from lab.decode.sampling import TokenChooser
from lab.decode.target import TRUNK
from lab.errors import ConfigError, require
from lab.model.trunk import AttentionContext, rotary_angles


def is_batch(prompt) -> bool:
    """A [B, P] tensor or a list/tuple of 1-D prompts (a plain [P] tensor is one request)."""
    return isinstance(prompt, (list, tuple)) or (torch.is_tensor(prompt) and prompt.dim() == 2)


def prompt_rows(prompt) -> list[torch.Tensor]:
    """The batch as a list of 1-D LongTensors (one per request)."""
    rows = list(prompt.unbind(0)) if torch.is_tensor(prompt) else [torch.as_tensor(p) for p in prompt]
    require(len(rows) >= 1, "prompt", "a batch needs at least one prompt")
    return rows


class BatchedCaches:
    """Left-padded K/V of B rows for every stack a forward touches; builds the per-row masks and positions."""

    def __init__(self, model, pads: torch.Tensor):
        cfg = model.model_cfg
        self.head_dim, self.rope_base = cfg.d_model // cfg.n_heads, cfg.rope_base
        self.pads = pads  # [B] padding slots before each row's first token
        self.caches: dict = {}
        self.length = 0  # slots held by every cache (the same for all rows)
        self.peak_bytes = 0

    def contexts(self, n_rows: int):
        """`ctx_for(key)` for one forward of `n_rows` new slots per row: one mask and one rotary table, a cache per stack."""
        slots = torch.arange(self.length + n_rows, device=self.pads.device)  # [L] key slots after this forward
        queries = slots[self.length :]  # [n] the new slots
        positions = (queries[None] - self.pads[:, None]).clamp_min(0)  # [B, n]: padding slots sit at position 0
        cos, sin = rotary_angles(positions, self.head_dim, self.rope_base)  # [B, 1, n, hd/2] each
        own = slots[None] >= self.pads[:, None]  # [B, L]: the row's own slots (not padding)
        causal = slots[None, :] <= queries[:, None]  # [n, L]
        diagonal = slots[None, :] == queries[:, None]  # [n, L]: keeps a padding query's softmax finite
        mask = ((own[:, None, :] & causal[None]) | diagonal[None])[:, None]  # [B, 1, n, L]
        return lambda key: AttentionContext(mask, cos, sin, kv=self.caches.setdefault(key, StackCache(key, "target")))

    def advance(self, n_rows: int) -> None:
        self.length += n_rows
        for cache in self.caches.values():
            cache.commit()
        self.peak_bytes = max(self.peak_bytes, sum(c.length * c.row_bytes() for c in self.caches.values()))


def batched_logits(model, caches: BatchedCaches, ids: torch.Tensor) -> torch.Tensor:
    """ids [B, n] at the next slots -> [B, V] next-token logits at each row's last new slot."""
    ctx_for = caches.contexts(ids.shape[1])
    hidden = model.trunk(ids, ctx_for(TRUNK))  # [B, n, d]
    rows = next(model.head.horizon_rows(hidden, ctx_for))  # [B, n, d] horizon 1 (draft stacks never run)
    caches.advance(ids.shape[1])
    return model.horizon_logits(1, rows[:, -1])  # [B, V]


def choose_rows(chooser: TokenChooser, logits: torch.Tensor) -> torch.Tensor:
    """[B, V] logits -> [B] tokens: each row's argmax, or one independent draw from each row's distribution."""
    if chooser.greedy:
        return logits.argmax(dim=-1)  # [B]
    return torch.multinomial(chooser.probs(logits), 1, generator=chooser.generator)[:, 0]  # [B]


def generate_batch(model, prompt, max_new_tokens: int, *, temperature: float = 0.0, top_k: int | None = None, speculative: bool = False,
                   draft_steps: int | None = None, eos: int | None = None, generator: torch.Generator | None = None) -> list:
    """Plain decoding of every prompt of the batch; one Generation per prompt, in order."""
    from lab.decode.generate import Generation, check_request  # the single-request API's checks and result type

    rows = prompt_rows(prompt)
    for row in rows:
        check_request(model, row, max_new_tokens, temperature, top_k, draft_steps)
    if speculative:
        raise ConfigError("speculative", "batched speculative decoding is not implemented; pass one prompt at a time or speculative=False")
    model.eval()
    with torch.no_grad():
        return [Generation(out, stats) for out, stats in decode_rows(model, rows, max_new_tokens, TokenChooser(temperature, top_k, generator), eos)]


def decode_rows(model, rows: list[torch.Tensor], max_new_tokens: int, chooser: TokenChooser, eos: int | None) -> list[tuple[list[int], dict]]:
    device = next(model.parameters()).device
    lengths = torch.tensor([r.numel() for r in rows], device=device)  # [B]
    width = int(lengths.max())
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)  # [B, P] left-padded with token 0
    for b, row in enumerate(rows):
        ids[b, width - row.numel() :] = row.to(device)  # [P_b] right-aligned
    caches = BatchedCaches(model, width - lengths)
    outputs: list[list[int]] = [[] for _ in rows]
    done = lambda out: len(out) == max_new_tokens or (bool(out) and out[-1] == eos)  # noqa: E731
    begin = time.perf_counter()
    prefill_s, forwards = 0.0, 0
    if max_new_tokens > 0:
        logits = batched_logits(model, caches, ids)  # prefill: [B, V]
        forwards, prefill_s = 1, time.perf_counter() - begin
        while True:
            tokens = choose_rows(chooser, logits)  # [B]
            for out, token in zip(outputs, tokens.tolist()):
                if not done(out):
                    out.append(token)
            if all(done(out) for out in outputs):
                break
            logits = batched_logits(model, caches, tokens[:, None])  # [B, V]: stopped rows ride along, their tokens dropped
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
    return {
        **shared, "rounds": rounds, "emitted": len(out), "fallbacks": 0, "proposed_by_position": [], "accepted_by_position": [],
        "emitted_by_round": [1] * rounds, "proposed_by_round": [0] * rounds, "accepted_by_round": [0] * rounds,
        "stopped_by_round": [i == rounds - 1 for i in range(rounds)], "draft_time_s": 0.0, "verify_time_s": elapsed - shared["prefill_time_s"],
        "tokens_per_s": len(out) / elapsed if elapsed > 0 else float("nan"),
        "tokens_per_forward": len(out) / shared["target_forwards"] if shared["target_forwards"] else float("nan"),
        **acceptance_conventions([0] * rounds, [0] * rounds, 0),
    }

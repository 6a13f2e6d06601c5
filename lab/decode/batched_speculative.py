"""Batched speculative decoding with independent draft heads (those whose drafter says `drafts_batches`).

B requests share every target pass: each round appends [frontier, m drafts] to every row
(m = the largest of the rows' draft counts; a row with fewer drafts, or one that has stopped,
pads with token 0), and each row then accepts its own prefix with the single-request
selector (lab.inference.acceptance.select), so its law is a single request's. Slots a row does
not keep (rejected drafts, padding) become holes in the shared caches (lab.decode.batched):
the row's queries never see them and its positions skip them. The draft heads' rows come
out of the same pass, read at each row's last kept slot.

With one generator per request (`generator=[g_1, …, g_B]`) row b draws its random numbers in
exactly the order a single request with g_b does, so its tokens equal that request's.
DeepSeek's chain keeps per-step caches whose rows depend on drafts: one request at a time.
"""

from __future__ import annotations

import time

import torch

from lab.decode.batched import BatchedCaches, batched_rows, left_padded
from lab.errors import ConfigError
from lab.inference.acceptance import select
from lab.inference.ledger import acceptance_conventions, count_round, record_round, round_counters, settle_paths
from lab.inference.sampling import TokenChooser
from lab.model.heads.independent_drafter import DraftProjection


def check_batched_speculative(model, draft_steps: int | None) -> int:
    """The drafts per round, or one line saying why this model cannot decode a batch speculatively."""
    head = model.head
    if not head.can_draft:
        raise ConfigError("speculative", f"head '{model.head_cfg.name}' with K={model.k} has no draft heads at offsets 2..K; use speculative=False")
    if not head.drafter.drafts_batches:
        raise ConfigError("speculative", f"batched speculative decoding drafts with independent heads; head '{model.head_cfg.name}' "
                          "drafts a chain: pass its prompts one at a time")
    return model.k - 1 if draft_steps is None else min(draft_steps, model.k - 1)


def draft_logits_at(project, horizons: list[torch.Tensor], slot: torch.Tensor) -> torch.Tensor:
    """Horizons 2..K's logits at each row's slot: horizons K × [B, n, d], slot [B] -> [B, K-1, V];
    `project` is the batch's DraftProjection (lab/model/heads/independent_drafter.py), the one single requests use."""
    rows = torch.arange(slot.shape[0], device=slot.device)  # [B]
    draft_rows = torch.stack([h[rows, slot] for h in horizons[1:]])  # [K-1, B, d]
    return project(draft_rows).transpose(0, 1)  # [B, K-1, V]


def speculative_rows(model, rows: list[torch.Tensor], max_new_tokens: int, choosers: list[TokenChooser], eos: int | None,
                     draft_steps: int | None) -> list[tuple[list[int], dict]]:
    max_drafts = check_batched_speculative(model, draft_steps)
    device = next(model.parameters()).device
    ids, prompt_valid = left_padded(rows, device)  # [B, P] each
    caches = BatchedCaches(model, len(rows), device)
    project = DraftProjection(model)
    outputs: list[list[int]] = [[] for _ in rows]
    counters = [round_counters(max_drafts, target_forwards=1) for _ in rows]  # the prefill is the first forward
    done = lambda out: len(out) == max_new_tokens or (bool(out) and out[-1] == eos)  # noqa: E731
    begin = time.perf_counter()
    prefill_s = verify_s = 0.0
    if max_new_tokens > 0:
        horizons = list(batched_rows(model, caches, ids, prompt_valid))  # K × [B, P, d]
        caches.advance(prompt_valid)
        last = torch.full((len(rows),), ids.shape[1] - 1, device=device)  # [B]: left padding puts every prompt's end last
        target = model.horizon_logits(1, horizons[0][:, -1])  # [B, V]
        drafting = draft_logits_at(project, horizons, last)  # [B, K-1, V]
        for b, out in enumerate(outputs):
            out.append(choosers[b].choose(target[b])[0])
        prefill_s = time.perf_counter() - begin
        while not all(done(out) for out in outputs):
            start = time.perf_counter()
            drafting = one_round(model, project, caches, outputs, drafting, choosers, counters, max_drafts, max_new_tokens, eos, done)
            verify_s += time.perf_counter() - start
    elapsed = time.perf_counter() - begin
    batch_tokens = sum(map(len, outputs))
    results = []
    for out, s in zip(outputs, counters):
        settle_paths(s, out, max_drafts)
        s.update(
            emitted=len(out), prefill_time_s=prefill_s, draft_time_s=0.0, verify_time_s=verify_s, total_time_s=elapsed,
            tokens_per_s=len(out) / elapsed if elapsed > 0 else float("nan"), tokens_per_forward=len(out) / s["target_forwards"],
            batch_size=len(rows), batch_tokens_per_s=batch_tokens / elapsed if elapsed > 0 else float("nan"),
            kv_bytes={"target": caches.peak_bytes, "draft": 0, "branch_peak": 0},  # every stack's slots, holes included
            **acceptance_conventions(s["proposed_by_round"], s["accepted_by_round"], max_drafts),
        )
        results.append((out, s))
    return results


def one_round(model, project, caches, outputs, drafting, choosers, counters, max_drafts, max_new_tokens, eos, done) -> torch.Tensor:
    """Draft, verify every row in one pass, accept per row, keep the verified slots; returns the next draft logits [B, K-1, V]."""
    device = drafting.device
    counts = [0 if done(out) else min(max_drafts, max_new_tokens - len(out)) for out in outputs]  # drafts per row
    width = max(counts)
    drafts, probs = [[] for _ in outputs], [[] for _ in outputs]
    for b, m in enumerate(counts):
        for i in range(m):  # head i + 2 drafts the slot i + 1 places after the frontier
            token, q = choosers[b].choose(drafting[b, i])
            drafts[b].append(token), probs[b].append(q)
    ids = torch.tensor([[out[-1], *d, *[0] * (width - len(d))] for out, d in zip(outputs, drafts)], device=device)  # [B, 1+m]
    horizons = list(batched_rows(model, caches, ids, torch.ones_like(ids, dtype=torch.bool)))  # K × [B, 1+m, d]
    target = model.horizon_logits(1, horizons[0])  # [B, 1+m, V]: slot i predicts the token after input i
    accepted = [0] * len(outputs)
    for b, out in enumerate(outputs):
        if done(out):
            continue  # a stopped row rides along; only its frontier slot is kept (never read again)
        accepted[b], following = select(drafts[b], probs[b], target[b, : counts[b] + 1], choosers[b])
        remaining = max_new_tokens - len(out)
        new = [*drafts[b][: accepted[b]], following][:remaining]  # an accepted last-slot draft gets no bonus
        if eos in new:
            new = new[: new.index(eos) + 1]  # an accepted EOS ends the output (no bonus)
        if counts[b]:
            record_round(counters[b], len(out) - 1, drafts[b], accepted[b])
        out += new
        counters[b]["target_forwards"] += 1
        count_round(counters[b], counts[b], accepted[b], len(new), len(new) == remaining or new[-1] == eos)
    kept = torch.tensor(accepted, device=device)  # [B] drafts kept after each row's frontier
    caches.advance(torch.arange(width + 1, device=device)[None] <= kept[:, None])  # [B, 1+m]: frontier + accepted drafts
    return draft_logits_at(project, horizons, kept)  # [B, K-1, V] at each row's last kept slot

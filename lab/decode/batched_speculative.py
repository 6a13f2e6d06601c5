"""Batched speculative decoding with independent draft heads (those whose drafter says `drafts_batches`).

B requests share every target pass: each round appends [frontier, m drafts] to every row
(m = the largest of the rows' draft counts; a row with fewer drafts, or one that has stopped,
pads with token 0), and each row proposes and accepts its own prefix as a single request does
(`IndependentHeads.for_batch`, lab.decode_core.acceptance.accept_tree), so its law is a single
request's. Slots a row does not keep (rejected drafts, padding) become holes in the shared caches
(lab.decode.batched): the row's queries never see them and its positions skip them. The draft
heads' rows come out of the same pass, read at each row's last kept slot.

With one generator per request (`generator=[g_1, …, g_B]`) row b draws its random numbers in
exactly the order a single request with g_b does, so its tokens equal that request's.
DeepSeek's chain keeps per-step caches whose rows depend on drafts: one request at a time.
"""

from __future__ import annotations

import time

import torch

from lab.decode.batched import BatchedCaches, batched_rows, left_padded
from lab.errors import ConfigError
from lab.decode_core.acceptance import accept_tree
from lab.decode_core.ledger import RoundLedger
from lab.decode_core.sampling import TokenChooser


def check_batched_speculative(model, draft_steps: int | None) -> int:
    """The drafts per round, or one line saying why this model cannot decode a batch speculatively."""
    head = model.head
    if not head.can_draft:
        raise ConfigError("speculative", f"head '{model.head_cfg.name}' with K={model.k} has no draft heads at offsets 2..K; use speculative=False")
    if not head.drafter.drafts_batches:
        raise ConfigError("speculative", f"batched speculative decoding drafts with independent heads; head '{model.head_cfg.name}' "
                          "drafts a chain: pass its prompts one at a time")
    return model.k - 1 if draft_steps is None else min(draft_steps, model.k - 1)


def speculative_rows(model, rows: list[torch.Tensor], max_new_tokens: int, choosers: list[TokenChooser], eos: int | None,
                     draft_steps: int | None) -> list[tuple[list[int], dict]]:
    max_drafts = check_batched_speculative(model, draft_steps)
    device = next(model.parameters()).device
    ids, prompt_valid = left_padded(rows, device)  # [B, P] each
    caches = BatchedCaches(model, len(rows), device)
    drafter = model.head.drafter.for_batch(model)
    outputs: list[list[int]] = [[] for _ in rows]
    ledgers = [RoundLedger(max_drafts, target_forwards=1) for _ in rows]  # the prefill is the first forward
    done = lambda out: len(out) == max_new_tokens or (bool(out) and out[-1] == eos)  # noqa: E731
    begin = time.perf_counter()
    prefill_s = verify_s = 0.0
    if max_new_tokens > 0:
        horizons = list(batched_rows(model, caches, ids, prompt_valid))  # K × [B, P, d]
        caches.advance(prompt_valid)
        last = torch.full((len(rows),), ids.shape[1] - 1, device=device)  # [B]: left padding puts every prompt's end last
        target = model.horizon_logits(1, horizons[0][:, -1])  # [B, V]
        drafting = drafter.next_logits(horizons, last)  # [B, K-1, V]
        for b, out in enumerate(outputs):
            out.append(choosers[b].choose(target[b])[0])
        prefill_s = time.perf_counter() - begin
        while not all(done(out) for out in outputs):
            start = time.perf_counter()
            drafting = one_round(model, drafter, caches, outputs, drafting, choosers, ledgers, max_drafts, max_new_tokens, eos, done)
            verify_s += time.perf_counter() - start
    elapsed = time.perf_counter() - begin
    batch_tokens = sum(map(len, outputs))
    results = []
    for out, ledger in zip(outputs, ledgers):
        results.append((out, {
            **ledger.stats(out), "prefill_time_s": prefill_s, "draft_time_s": 0.0, "verify_time_s": verify_s, "total_time_s": elapsed,
            "tokens_per_s": len(out) / elapsed if elapsed > 0 else float("nan"),
            "batch_size": len(rows), "batch_tokens_per_s": batch_tokens / elapsed if elapsed > 0 else float("nan"),
            "kv_bytes": {"target": caches.peak_bytes, "draft": 0, "branch_peak": 0},  # every stack's slots, holes included
        }))
    return results


def one_round(model, drafter, caches, outputs, drafting, choosers, ledgers, max_drafts, max_new_tokens, eos, done) -> torch.Tensor:
    """Draft, verify every row in one pass, accept per row, keep the verified slots; returns the next draft logits [B, K-1, V]."""
    device = drafting.device
    wanted = [0 if done(out) else min(max_drafts, max_new_tokens - len(out)) for out in outputs]  # drafts per row
    buffers = [drafter.propose(drafting[b], out[-1], m, choosers[b]) if m else None for b, (out, m) in enumerate(zip(outputs, wanted))]  # None: stopped
    drafts = [[] if buffer is None else buffer.tokens[1:] for buffer in buffers]  # a chain: node i is draft i
    counts = [len(d) for d in drafts]  # a draft vocabulary may leave fewer candidates than asked
    width = max(counts)
    ids = torch.tensor([[out[-1], *d, *[0] * (width - len(d))] for out, d in zip(outputs, drafts)], device=device)  # [B, 1+m]
    horizons = list(batched_rows(model, caches, ids, torch.ones_like(ids, dtype=torch.bool)))  # K × [B, 1+m, d]
    target = model.horizon_logits(1, horizons[0])  # [B, 1+m, V]: slot i predicts the token after input i
    accepted = [0] * len(outputs)
    for b, out in enumerate(outputs):
        if done(out):
            continue  # a stopped row rides along; only its frontier slot is kept (never read again)
        path, following = accept_tree(buffers[b], target[b, : counts[b] + 1], choosers[b])  # a running row drafts ≥ 1
        accepted[b] = len(path)
        remaining = max_new_tokens - len(out)
        new = [*drafts[b][: accepted[b]], following][:remaining]  # an accepted last-slot draft gets no bonus
        if eos in new:
            new = new[: new.index(eos) + 1]  # an accepted EOS ends the output (no bonus)
        if counts[b]:
            ledgers[b].record_path(len(out) - 1, drafts[b], accepted[b])
        out += new
        ledgers[b].target_forwards += 1
        ledgers[b].count_round(counts[b], accepted[b], len(new), len(new) == remaining or new[-1] == eos)
    kept = torch.tensor(accepted, device=device)  # [B] drafts kept after each row's frontier
    caches.advance(torch.arange(width + 1, device=device)[None] <= kept[:, None])  # [B, 1+m]: frontier + accepted drafts
    return drafter.next_logits(horizons, kept)  # [B, K-1, V] at each row's last kept slot

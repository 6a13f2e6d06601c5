"""Decoding evaluation helpers: held-out prompts, plain vs speculative runs, degeneracy, answer accuracy.

Shared by the end-of-training callback (lab.callbacks.decoding) and the decoding benchmark;
answer accuracy of synthetic tasks lives in lab.decode.answers (re-exported here).
A continuation with fewer than 20 % distinct 4-grams is `degenerate` (DESIGN.md §10): a
small model's greedy output often collapses into one repeated token, and then every draft
is "accepted", which says nothing about the heads.
"""

from __future__ import annotations

import torch

from lab.decode.answers import answer_accuracy, teacher_forced_answers  # noqa: F401 (re-export)
from lab.decode.generate import generate
from lab.decode.ledger import ledger, merge

DEGENERATE_BELOW = 0.2


def distinct_ngram_ratio(tokens: list[int], n: int = 4) -> float:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def document_prompts(batches, count: int, length: int) -> list[list[int]]:
    """Up to `count` prompts: the first tokens of validation documents (≤ `length`, ≤ half the document)."""
    prompts = []
    for batch in batches:
        tokens, segments, active = batch["tokens"], batch["segment_ids"], batch["active"]
        for row in range(tokens.shape[0]):
            for segment in segments[row].unique().tolist():
                if segment < 0:
                    continue
                doc = tokens[row][(segments[row] == segment) & active[row]].tolist()  # one document occurrence
                if len(doc) >= 2:
                    prompts.append(doc[: min(length, len(doc) // 2)])
                if len(prompts) == count:
                    return prompts
    return prompts


def evaluate_decoding(model, prompts: list[list[int]], new_tokens: int, temperature: float = 0.0, seed: int = 0) -> dict:
    """Plain and speculative (when the head drafts) decoding of each prompt; metrics, ledgers, per-prompt outputs."""
    speculative = model.head.can_draft  # drafting heads at offsets 2..K
    plain_runs, spec_runs, per_prompt = [], [], []
    for i, prompt in enumerate(prompts):
        ids = torch.tensor(prompt)
        plain = generate(model, ids, new_tokens, temperature=temperature, generator=torch.Generator().manual_seed(seed + i))
        plain_runs.append(plain.stats)
        entry = {"prompt": prompt, "plain_tokens": plain.tokens, "distinct4": distinct_ngram_ratio(plain.tokens)}
        entry["degenerate"] = not entry["distinct4"] >= DEGENERATE_BELOW
        if speculative:
            spec = generate(model, ids, new_tokens, temperature=temperature, speculative=True, generator=torch.Generator().manual_seed(seed + i))
            spec_runs.append(spec.stats)
            entry.update(speculative_tokens=spec.tokens, match=spec.tokens == plain.tokens)
        per_prompt.append(entry)
    plain_total = merge(plain_runs)
    metrics = {"decode/tokens_per_forward": 1.0, "decode/distinct4": sum(e["distinct4"] for e in per_prompt) / len(per_prompt)}
    result = {"settings": {"prompts": len(prompts), "new_tokens": new_tokens, "temperature": temperature},
              "plain": ledger(plain_total), "prompts": per_prompt}
    if speculative:
        summary = ledger(merge(spec_runs), plain_total)
        result["speculative"] = summary
        metrics["decode/tokens_per_forward"] = summary["tokens_per_forward"]
        metrics["decode/speedup"] = summary["measured_speedup"]
        metrics["decode/predicted_speedup"] = summary["predicted_speedup"]
        metrics["decode/greedy_match"] = sum(e["match"] for e in per_prompt) / len(per_prompt)
        for j, rate in enumerate(summary["accept_by_position"], start=1):
            metrics[f"decode/accept/p{j}"] = rate
    result["metrics"] = {name: float(value) for name, value in metrics.items()}
    return result

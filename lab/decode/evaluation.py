"""Decoding evaluation helpers: held-out prompts, plain vs speculative runs, degeneracy, answer accuracy.

Shared by the end-of-training callback (lab.callbacks.decoding) and the decoding benchmark;
answer accuracy of synthetic tasks lives in lab.decode.answers (re-exported here).
A continuation with fewer than 20 % distinct 4-grams is `degenerate`: a
small model's greedy output often collapses into one repeated token, and then every draft
is "accepted", which says nothing about the heads.
"""

from __future__ import annotations

import torch

from lab.decode.answers import answer_accuracy, teacher_forced_answers  # noqa: F401 (re-export)
from lab.decode.generate import generate
from lab.decode.paired import pair_order, paired_metrics
from lab.decode_core.ledger import ledger, merge
from lab.tracking.timing import Stopwatch

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


def evaluate_decoding(model, prompts: list[list[int]], new_tokens: int, temperature: float = 1.0, greedy: bool = True, seed: int = 0,
                      repeats: int = 1, tick=None) -> dict:
    """Plain and speculative decoding of each prompt at `temperature` (the headline, `decode/*`) and, with
    `greedy` and T > 0, greedy as well (`decode/greedy/*`); metrics, ledgers, per-prompt outputs, timings.

    Headline acceptance and speed come from the prompts whose continuation is not degenerate;
    `decode/degenerate` is the fraction left out, `decode/distinct4` the mean distinct-4-gram ratio
    over all prompts. Each prompt is decoded `repeats` times on each side, interleaved (lab.decode.paired);
    `tick()` is called after every request (a progress bar).
    """
    result = decode_prompts(model, prompts, new_tokens, temperature, seed, repeats, tick)
    metrics = result.pop("metrics")
    if decoding_passes(greedy, temperature) == 2:
        result["greedy"] = decode_prompts(model, prompts, new_tokens, 0.0, seed, repeats, tick)
        metrics.update({name.replace("decode/", "decode/greedy/", 1): value for name, value in result["greedy"].pop("metrics").items()})
    result["metrics"] = {name: float(value) for name, value in metrics.items()}
    return result


def decoding_passes(greedy: bool, temperature: float) -> int:
    """Temperatures `evaluate_decoding` decodes at: `temperature`, and greedy too when asked and T > 0."""
    return 2 if greedy and temperature > 0 else 1


def requests_per_prompt(speculative: bool, greedy: bool, temperature: float, repeats: int) -> int:
    """How many `generate` calls `evaluate_decoding` makes per prompt (the progress bar's unit)."""
    return decoding_passes(greedy, temperature) * repeats * (2 if speculative else 1)


def timed_generate(watch: Stopwatch, model, prompt: list[int], new_tokens: int, temperature: float, seed: int, speculative: bool):
    """One request, timed by `watch`: (Generation, its Span)."""
    watch.start()
    generation = generate(model, torch.tensor(prompt), new_tokens, temperature=temperature, speculative=speculative,
                          generator=torch.Generator().manual_seed(seed))
    return generation, watch.stop()


def decode_prompts(model, prompts: list[list[int]], new_tokens: int, temperature: float, seed: int, repeats: int = 1, tick=None) -> dict:
    """One temperature: every prompt plain and speculative (same seed), `repeats` times, interleaved pair by pair;
    `decode/*` metrics over the clean prompts (tokens and ledgers from the first repeat: later ones draw the same)."""
    speculative = model.head.can_draft  # drafting heads at offsets 2..K
    first, pairs, span = paired_runs(model, prompts, new_tokens, temperature, seed, repeats, tick)
    result = summarize(first, prompts, new_tokens, temperature, speculative)
    clean = [i for i, entry in enumerate(result["prompts"]) if not entry["degenerate"]]
    if speculative and clean:
        result["metrics"].update(paired_metrics([pair for i in clean for pair in pairs[i]]))
    result["timing"] = span.record()
    result["metrics"].update(timing_metrics(span))
    return result


def paired_runs(model, prompts: list[list[int]], new_tokens: int, temperature: float, seed: int, repeats: int = 1, tick=None):
    """Every prompt decoded `repeats` times on each side, the two sides of a pair back to back (lab.decode.paired):
    (per prompt {False: plain, True: speculative} Generations of the first repeat, per prompt its pairs
    (tokens spec, span spec, tokens plain, span plain), the Span of every request together)."""
    speculative = model.head.can_draft
    watch = Stopwatch(next(model.parameters()).device)
    first: list[dict] = [{} for _ in prompts]
    pairs: list[list[tuple]] = [[] for _ in prompts]
    for repeat in range(repeats):
        for i, prompt in enumerate(prompts):
            measured = {}
            for side in pair_order(i, repeat) if speculative else (False,):
                generation, span = timed_generate(watch, model, prompt, new_tokens, temperature, seed + i, side)
                measured[side] = (len(generation.tokens), span)
                first[i].setdefault(side, generation)
                if tick is not None:
                    tick()
            if speculative:
                pairs[i].append((*measured[True], *measured[False]))
    return first, pairs, watch.span


def timing_metrics(span) -> dict:
    """Whether the machine let the evaluation run (lab.tracking.timing): flag, worker CPU share, load at both ends."""
    return {"decode/contended": float(span.contended), "decode/cpu_share": span.cpu_share,
            "decode/load_start": span.load_start, "decode/load_end": span.load_end, "decode/threads": float(span.threads)}


def summarize(first: list[dict], prompts: list[list[int]], new_tokens: int, temperature: float, speculative: bool) -> dict:
    """Per-prompt outputs and flags, ledgers and the headline metrics of one repeat's generations."""
    per_prompt, plain_runs, spec_runs = [], [], []
    for prompt, runs in zip(prompts, first):
        plain = runs[False]
        entry = {"prompt": prompt, "plain_tokens": plain.tokens, "plain_distinct4": distinct_ngram_ratio(plain.tokens)}
        measured = plain  # the continuation whose acceptance the headline reports
        if speculative:
            measured = spec = runs[True]
            entry.update(speculative_tokens=spec.tokens, match=spec.tokens == plain.tokens)
        entry["distinct4"] = distinct_ngram_ratio(measured.tokens)
        entry["degenerate"] = not entry["distinct4"] >= DEGENERATE_BELOW
        per_prompt.append(entry)
        plain_runs.append(plain.stats), spec_runs.append(measured.stats)
    clean = [i for i, e in enumerate(per_prompt) if not e["degenerate"]]
    metrics = {"decode/distinct4": sum(e["distinct4"] for e in per_prompt) / len(per_prompt),
               "decode/degenerate": 1 - len(clean) / len(per_prompt), "decode/prompts_clean": len(clean)}
    result = {"settings": {"prompts": len(prompts), "new_tokens": new_tokens, "temperature": temperature},
              "plain": ledger(merge(plain_runs)), "prompts": per_prompt}
    if speculative:
        result["speculative"] = ledger(merge(spec_runs), merge(plain_runs))  # every prompt, degenerate ones included
        if temperature == 0:
            metrics["decode/greedy_match"] = sum(e["match"] for e in per_prompt) / len(per_prompt)
    if clean:
        plain_clean = merge([plain_runs[i] for i in clean])
        headline = ledger(merge([spec_runs[i] for i in clean]), plain_clean if speculative else None)
        result["headline"] = headline
        metrics.update(headline_metrics(headline, speculative))
    return result | {"metrics": metrics}


def headline_metrics(summary: dict, speculative: bool) -> dict:
    """`decode/*` of one ledger: tokens per forward, predicted speedup (the measured one is paired: lab.decode.paired), acceptance in both conventions and both mean lengths,
    path acceptance next to the Fréchet bounds of the per-position top-1 agreement (lab.decode_core.ledger)."""
    metrics = {"decode/tokens_per_forward": summary["tokens_per_forward"] if speculative else 1.0,
               "decode/mean_accept_len": summary["mean_accept_len"], "decode/mean_accepted": summary["mean_accepted"]}
    if speculative:
        metrics["decode/predicted_speedup"] = summary["predicted_speedup"]
        for j, (rate, conditional) in enumerate(zip(summary["accept_by_position"], summary["accept_cond_by_position"]), start=1):
            metrics[f"decode/accept/p{j}"], metrics[f"decode/accept_cond/p{j}"] = rate, conditional
        for j, agreement in enumerate(summary["top1_by_position"], start=1):
            metrics[f"decode/top1/p{j}"] = agreement
        for name in ("path_accept", "top1_all", "frechet_lower", "frechet_upper"):
            metrics[f"decode/{name}"] = summary[name]
    return metrics

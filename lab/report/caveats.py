"""Warnings the report prints next to its findings: where a number in the tables would mislead a reader.

Each warning names the test it applied and the numbers that tripped it:

- a model that has not beaten the corpus's unigram entropy (validation next-token loss ≥ the training
  tokens' unigram entropy, nats per token): it has learned token frequencies at most;
- degenerate agreement: horizon-2 agreement ≥ AGREE_NEAR_ONE while the next-token accuracy is within
  SHARE_MARGIN of the most frequent token's share (every head predicting that token agrees trivially), so
  the agreement-based tokens/forward estimate is no decoding speed;
- collapsed heads: every horizon predicts the same id in ≥ COLLAPSED_SHARE of its rows;
- a significance claim made on fewer than 2 seeds (none is made; the warning says why).
"""

from __future__ import annotations

import statistics

from lab.report.records import finite
from lab.report.table import Variant, baseline_of

AGREE_NEAR_ONE = 0.95
SHARE_MARGIN = 0.05
COLLAPSED_SHARE = 0.5


def corpus_value(variants: list[Variant], name: str) -> float | None:
    """The median over completed jobs of one run.json `corpus_stats` entry (None when no job recorded it)."""
    values = [r.get("corpus", {}).get(name) for v in variants for r in v.ok]
    values = [x for x in values if finite(x)]
    return statistics.median(values) if values else None


def above_unigram(variants: list[Variant]) -> list[str]:
    entropy = corpus_value(variants, "unigram_nats_per_token")
    scored = [(v, v.stat("val/loss")[0]) for v in variants if v.stat("val/loss")[0] is not None]
    if entropy is None or not scored:
        return []
    above = [(v, loss) for v, loss in scored if loss >= entropy]
    if not above:
        return []
    who = "Every variant" if len(above) == len(scored) else f"{len(above)} of {len(scored)} variants"
    return [f"**Warning:** {who} still has a validation next-token loss at or above the training tokens' unigram entropy "
            f"({entropy:.3f} nats/token; test: val/loss ≥ it): " + "; ".join(f"{v.label} {loss:.3f}" for v, loss in above)
            + ". Such a model predicts little beyond token frequencies; differences between these variants say little about their architectures."]


def degenerate_agreement(variants: list[Variant]) -> list[str]:
    share = corpus_value(variants, "top_token_share")
    out = []
    for v in variants:
        agree, accuracy = v.stat("val/agree/h2")[0], v.stat("val/acc/h1")[0]
        if agree is None or accuracy is None or agree < AGREE_NEAR_ONE:
            continue
        predicted_share = v.stat("val/top_token_share/h1")[0]
        frequent = share is not None and accuracy <= share + SHARE_MARGIN
        one_token = predicted_share is not None and predicted_share >= COLLAPSED_SHARE
        if not (frequent or one_token):
            continue
        evidence = (f"top-1 accuracy {accuracy:.3f} against the most frequent token's share {share:.3f}" if frequent
                    else f"its next-token head predicts one id in {predicted_share:.0%} of rows")
        out.append(f"**Warning:** {v.label}'s horizon-2 agreement is {agree:.4f} (≥ {AGREE_NEAR_ONE}) with {evidence}: its heads agree "
                   f"because they predict the same frequent token, so its est tokens/forward ({v.cell('val/est_tokens_per_forward', 2)}) "
                   "is not a decoding speed.")
    return out


def collapsed_heads(variants: list[Variant]) -> list[str]:
    out = []
    for v in variants:
        if v.max_k < 2:
            continue
        tops = [v.stat(f"val/top_token/h{k}")[0] for k in range(1, v.max_k + 1)]
        shares = [v.stat(f"val/top_token_share/h{k}")[0] for k in range(1, v.max_k + 1)]
        if any(x is None for x in tops + shares) or len({round(t) for t in tops}) != 1 or min(shares) < COLLAPSED_SHARE:
            continue
        out.append(f"**Warning:** every head of {v.label} predicts the same token (id {round(tops[0])}) in most of its rows "
                   f"(shares h1..h{v.max_k}: " + ", ".join(f"{x:.2f}" for x in shares) + f"; test: one id, each share ≥ {COLLAPSED_SHARE}).")
    return out


def too_few_seeds(variants: list[Variant]) -> list[str]:
    baseline = baseline_of(variants)
    if baseline is None or len(variants) < 2:
        return []
    seeds = {v.label: len(v.values("val/loss")) for v in variants}
    if all(n >= 2 for n in seeds.values()):
        return []
    few = [f"{label} n = {n}" for label, n in seeds.items() if n < 2]
    return [f"**Warning:** no significance is claimed for {', '.join(few)}: a difference needs ≥ 2 seeds on both sides "
            f"(sweep `seed=0,1,2`); with one seed it may be noise."]


def caveats(variants: list[Variant]) -> list[str]:
    return above_unigram(variants) + degenerate_agreement(variants) + collapsed_heads(variants) + too_few_seeds(variants)

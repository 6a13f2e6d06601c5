"""Warnings the report prints next to its findings: where a number in the tables would mislead a reader.

Each warning names the test it applied and the numbers that tripped it:

- validation that holds few documents or bytes (< MIN_VAL_DOCS or < MIN_VAL_BYTES): its numbers rest on little text;
- a model that has not beaten the unigram floor (validation next-token loss ≥ the validation tokens' cross-entropy
  under the training tokens' unigram, nats per token): it has learned token frequencies at most;
- degenerate agreement: horizon-2 agreement ≥ AGREE_NEAR_ONE while the next-token accuracy is within
  SHARE_MARGIN of the most frequent token's share (every head predicting that token agrees trivially), so
  the agreement-based tokens/forward estimate is no decoding speed;
- collapsed horizons: a horizon predicts one id in ≥ COLLAPSED_SHARE of its rows (each named: its acceptance and the
  decoding speed built on it count drafts of that token);
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
    floor = corpus_value(variants, "val_unigram_cross_entropy_nats")
    what = "the validation tokens' cross-entropy under the training tokens' unigram"
    if floor is None:  # a run recorded before that statistic: the training entropy, said as such
        floor = corpus_value(variants, "unigram_nats_per_token")
        what = "the training tokens' unigram entropy (these runs recorded no validation cross-entropy under it)"
    scored = [(v, v.stat("val/loss")[0]) for v in variants if v.stat("val/loss")[0] is not None]
    if floor is None or not scored:
        return []
    above = [(v, loss) for v, loss in scored if loss >= floor]
    if not above:
        return []
    who = "Every variant" if len(above) == len(scored) else f"{len(above)} of {len(scored)} variants"
    return [f"**Warning:** {who} still has a validation next-token loss at or above {what} ({floor:.3f} nats/token; test: "
            "val/loss ≥ it): " + "; ".join(f"{v.label} {loss:.3f}" for v, loss in above)
            + ". Such a model predicts little beyond token frequencies; differences between these variants say little about their architectures."]


MIN_VAL_DOCS = 10
MIN_VAL_BYTES = 50_000


def small_validation(variants: list[Variant]) -> list[str]:
    """Validation that holds few documents or bytes: its losses rest on little text, whatever the tables' digits."""
    docs, size = corpus_value(variants, "n_docs_val"), corpus_value(variants, "n_bytes_val")
    if docs is None or size is None or (docs >= MIN_VAL_DOCS and size >= MIN_VAL_BYTES):
        return []
    return [f"**Warning:** validation holds {docs:.0f} documents ({size / 1e3:.1f} KB; test: fewer than {MIN_VAL_DOCS} documents "
            f"or {MIN_VAL_BYTES / 1e3:.0f} KB): every validation number rests on that little text, which may not resemble the "
            "training documents. Raise `data.val_fraction` (default 0.05: the share of documents, by a hash of each, that "
            "validates) or give more documents."]


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


def collapsed_horizons(v: Variant) -> list[int]:
    """The horizons of `v` that predict one id in ≥ COLLAPSED_SHARE of their validation rows."""
    shares = {k: v.stat(f"val/top_token_share/h{k}")[0] for k in range(1, v.max_k + 1)}
    return [k for k, share in shares.items() if share is not None and share >= COLLAPSED_SHARE] if v.max_k >= 2 else []


def collapsed_heads(variants: list[Variant]) -> list[str]:
    """Each horizon that predicts one id in ≥ COLLAPSED_SHARE of its rows, named with the numbers it inflates."""
    out = []
    for v in variants:
        shares = {k: v.stat(f"val/top_token_share/h{k}")[0] for k in range(1, v.max_k + 1)}
        collapsed = collapsed_horizons(v)
        if not collapsed:
            continue
        top = {k: v.stat(f"val/top_token/h{k}")[0] for k in collapsed}
        named = ", ".join(f"h{k} (id {'?' if top[k] is None else round(top[k])}, {shares[k]:.0%} of its rows)" for k in collapsed)
        subject = (f"{len(collapsed)} of {v.max_k} horizons each predict one id in most rows" if len(collapsed) > 1
                   else f"1 of {v.max_k} horizons predicts one id in most rows")
        inflated = [f"{name} {v.cell(metric, 2)}" for name, metric in (("tokens/forward", "decode/tokens_per_forward"),
                    ("speedup", "decode/speedup"), ("est tokens/forward", "val/est_tokens_per_forward")) if v.stat(metric)[0] is not None]
        out.append(f"**Warning:** {v.label}: {subject}: {named} (test: one id in ≥ {COLLAPSED_SHARE:.0%} of a horizon's rows; "
                   f"shares h1..h{v.max_k}: " + ", ".join("—" if x is None else f"{x:.2f}" for x in shares.values()) + "). "
                   + (f"Its acceptance and decoding numbers ({'; '.join(inflated)}) count" if inflated else "Its acceptance counts")
                   + " drafts of those ids: not what its heads would give on real text.")
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
    return (small_validation(variants) + above_unigram(variants) + degenerate_agreement(variants) + collapsed_heads(variants)
            + too_few_seeds(variants))

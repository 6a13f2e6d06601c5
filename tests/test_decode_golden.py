"""Golden decoding: every head's decoders write the tokens and ledgers recorded in tests/golden/decode.json.

The file was written by the code before the architecture refactor (one trunk registry, the head contract moved
below heads and objective); the refactor promises no behaviour change, so these outputs must not move. Tiny seeded
models in float64 (no near-ties between the CPUs that run the suite: tokens and counts hold where the logits move
in their last bits, e.g. the float32 initial draw of a CPU without AVX2, checked with ATEN_CPU_CAPABILITY=default); per case: plain greedy, speculative greedy,
speculative sampling at T=1 with a seeded generator, a draft tree where the head drafts trees, prompt lookup, and a
batch of two prompts where the trunk batches speculative requests. Timings are left out of the ledgers.

Regenerate only on purpose (a change that is meant to move decoding): `python -m tests.test_decode_golden --write`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from lab.decode import generate
from tests.head_cases import cases, split
from tests.helpers import build_model

GOLDEN = Path(__file__).parent / "golden" / "decode.json"
PROMPTS = ([3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4], [7, 7, 2])  # the first repeats itself: prompt lookup finds matches
NEW_TOKENS = 14


def ledger(stats: dict) -> dict:
    """The round ledger without wall-clock fields (what was proposed, accepted and emitted stays)."""
    return {key: value for key, value in stats.items() if not key.endswith("_s") and not key.startswith("time")}


def decode_case(name: str, trunk: str) -> dict:
    """Every decoder this head offers on the case's model, as {decoder: [tokens, ledger]}."""
    head, k, extra = split(cases()[name])
    model = build_model(head, k, trunk=trunk, **{**extra, "compute_match": "none"}).double().eval()
    prompt = torch.tensor(PROMPTS[0])
    runs = {"plain": generate(model, prompt, NEW_TOKENS),
            "lookup": generate(model, prompt, NEW_TOKENS, speculative=True, ngram={"max_draft": 3})}  # merged with the heads' drafts
    if model.head.can_draft:
        runs["greedy"] = generate(model, prompt, NEW_TOKENS, speculative=True)
        runs["sampled"] = generate(model, prompt, NEW_TOKENS, speculative=True, temperature=1.0, generator=torch.Generator().manual_seed(7))
        if model.head.drafter.drafts_trees:
            runs["tree"] = generate(model, prompt, NEW_TOKENS, speculative=True, tree=[2, 2])
        if model.head.drafter.drafts_batches and trunk == "gpt":
            runs["batch"] = generate(model, [torch.tensor(p) for p in PROMPTS], NEW_TOKENS, speculative=True)
    out = {}
    for decoder, result in runs.items():
        if isinstance(result, list):
            out[decoder] = [[g.tokens, ledger(g.stats)] for g in result]
        else:
            out[decoder] = [result.tokens, ledger(result.stats)]
    return out


CASES = [(name, trunk) for trunk in ("gpt", "hf") for name in cases()]


def record() -> dict:
    return {f"{trunk}/{name}": decode_case(name, trunk) for name, trunk in CASES}


@pytest.mark.parametrize("name,trunk", CASES, ids=[f"{t}-{n}" for n, t in CASES])
def test_decoding_writes_the_recorded_tokens_and_ledgers(name, trunk):
    golden = json.loads(GOLDEN.read_text())
    assert json.loads(json.dumps(decode_case(name, trunk))) == golden[f"{trunk}/{name}"]


if __name__ == "__main__" and "--write" in sys.argv:
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")

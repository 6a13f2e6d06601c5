"""KV-cached incremental decoding (lab/decode_core/cache.py, target.py, proposers.py) equals full forwards.

Every head architecture, compute matching on and off, tied and untied embeddings, in
float64: the logits of each cached step equal a no-cache forward over the same sequence
(atol 1e-9), also after provisional rows were discarded (a rollback) — for the next-token
path, for every independent draft head, and for every DeepSeek draft step.
"""

from __future__ import annotations

import pytest
import torch

from lab.decode_core.sampling import TokenChooser
from lab.decode_core.target import TRUNK, CachedModel
from lab.model.heads.deepseek.drafter import DeepSeekChain
from lab.model.heads.independent_drafter import IndependentHeads
from tests.head_cases import case, cases, split
from tests.helpers import build_model, make_batch

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny tensors: one intra-op thread

# 1e-9 holds on any CPU: the models are float64 but for lab's rotary cos/sin (float32, lab/nn/blocks.py), which is
# elementwise from integer positions, so a position gets the same bits in a cached pass and in a full forward; the
# rest differs by float64 summation order (~1e-15). Transformers trunks also have float32 pieces that are not
# elementwise (RMSNorm, MoE routers): their tests run under tests/helpers.py's float64_throughout.
ATOL = 1e-9
HEADS = {  # every registered head, and variants
    **cases(),
    "linear_replicated": case("linear", unembedding="replicated"),
    "deepseek_shared_post_norm": case("deepseek", share_depth_weights=True, hidden_input="post_norm"),
    # transformers' / vLLM's MTP loop: depth d + 1 reads depth d's output after the shared final norm
    "deepseek_normed_chain": case("deepseek", hidden_input="post_norm", chain_state="normed"),
}
VARIANTS = [(head, matched, tie) for head in HEADS for matched in ("blocks", "none") for tie in (True, False)]  # head.compute_match


def model64(head: str, matched: str, tie: bool, seed: int = 0):
    name, k, extra = split(HEADS[head])
    if head == "linear_replicated" and tie is False:
        pass  # replicated projections are separate Parameters either way; untied trunk too
    return build_model(name, k, seed=seed, layers=5, tie=tie, compute_match=matched, **extra).double().eval()


def one_document(tokens: list[int]) -> dict:
    return make_batch([tokens], [[0] * len(tokens)])


def full_horizon_logits(model, tokens: list[int]) -> list[torch.Tensor]:
    """Horizon k's logits at every row that has a slot t+k inside the sequence, from one no-cache forward."""
    horizons = model(one_document(tokens))
    return [model.horizon_logits(h.k, h.hidden[0]) for h in horizons]  # k × [S-k, V]


def reference_next_token(model, tokens: list[int]) -> torch.Tensor:
    return model.next_token_logits(one_document(tokens))[0]  # [S, V]


@pytest.mark.parametrize("head,matched,tie", VARIANTS)
def test_cached_steps_match_full_forwards_with_rollbacks(head, matched, tie):
    model = model64(head, matched, tie)
    g = torch.Generator().manual_seed(1)
    vocab = model.model_cfg.vocab_size
    tokens = torch.randint(0, vocab, (6,), generator=g).tolist()  # the prompt
    state = CachedModel(model)
    drafts = state.model.head.drafter is IndependentHeads and model.k > 1
    with torch.no_grad():
        chunk = tokens
        committed: list[int] = []
        for step in range(8):
            result = state.forward(chunk)  # rows stay provisional
            sequence = committed + chunk
            reference = reference_next_token(model, sequence)[len(committed) :]  # [n, V]
            torch.testing.assert_close(result.logits, reference, atol=ATOL, rtol=0, msg=f"{head} step {step}")
            if drafts:
                full = full_horizon_logits(model, sequence)
                for k, rows in enumerate(result.more_horizons, start=2):
                    got = model.horizon_logits(k, rows[0])  # [n, V]
                    # Rows whose slot t+k lies inside `sequence` exist in the full forward.
                    upto = len(sequence) - k
                    if upto > len(committed):
                        torch.testing.assert_close(got[: upto - len(committed)], full[k - 1][len(committed) : upto], atol=ATOL, rtol=0)
            if step % 3 == 1:  # rollback: the whole branch is discarded
                state.caches.discard()
            else:  # commit a prefix of the branch, drop the rest
                keep = max(1, len(chunk) - step % 2)
                state.caches.commit(keep)
                committed += chunk[:keep]
            assert all(c.committed == len(committed) for c in state.caches.caches.values())
            chunk = torch.randint(0, vocab, (1 + step % 3,), generator=g).tolist()
    assert state.caches.cache(TRUNK).committed == len(committed) > 6


@pytest.mark.parametrize("head", ["deepseek", "deepseek_shared_post_norm", "deepseek_normed_chain"])
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("steps", [1, 2, 4])
def test_deepseek_draft_steps_match_teacher_forced_forwards(head, tie, steps):
    """Draft step s ≤ D at the last committed row == depth s of a full forward over tokens + frontier + drafts.

    Over several rounds with commits of different lengths, so final rows are built from
    committed state in pieces and provisional rows are dropped in between. Steps beyond D
    reuse module (s-1) mod D + 1 and have no training-forward counterpart; they must still
    be a function of committed state + drafts only (checked by rerunning on a fresh cache).
    """
    model = model64(head, "next_token_path", tie)
    depth = model.head.depth
    state = CachedModel(model)
    chain = DeepSeekChain(state, draft_steps=steps)
    greedy = TokenChooser(0.0, None, None)
    g = torch.Generator().manual_seed(2)
    vocab = model.model_cfg.vocab_size
    tokens = torch.randint(0, vocab, (5,), generator=g).tolist()
    with torch.no_grad():
        result = state.forward(tokens)
        chain.after_verify(result, list(range(len(tokens))))
        state.commit(len(tokens))
        for round_ in range(5):
            frontier = int(torch.randint(0, vocab, (), generator=g))
            drafts = chain.draft_chain(tokens, frontier, steps, greedy)[0]
            path = tokens + [frontier] + drafts
            full = full_horizon_logits(model, path)
            for step in range(1, min(steps, depth) + 1):
                expected = full[step][len(tokens) - 1]  # depth `step` at row n-1 (teacher = path)
                torch.testing.assert_close(chain.draft_logits[step - 1], expected, atol=ATOL, rtol=0)
            # A fresh cache that prefills the same committed tokens proposes the same logits.
            fresh_state = CachedModel(model)
            fresh = DeepSeekChain(fresh_state, draft_steps=steps)
            fresh.after_verify(fresh_state.forward(tokens), list(range(len(tokens))))
            fresh_state.commit(len(tokens))
            assert fresh.draft_chain(tokens, frontier, steps, greedy)[0] == drafts
            for a, b in zip(fresh.draft_logits, chain.draft_logits):
                torch.testing.assert_close(a, b, atol=ATOL, rtol=0)

            kept = min(1 + round_ % 3, 1 + len(drafts))  # the frontier's row + some drafts (as if accepted)
            chain.after_verify(state.forward([frontier, *drafts][:kept]), list(range(kept)))
            state.commit(kept)
            tokens = tokens + [frontier, *drafts][:kept]
            for (kind, *rest), cache in state.caches.caches.items():
                assert cache.provisional == 0
                if kind == "step":  # only rows whose teacher tokens are all committed output
                    assert cache.committed <= len(tokens) - rest[0] + 1

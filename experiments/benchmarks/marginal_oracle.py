"""The marginal oracle: what perfectly trained independent heads (Medusa-1, linear …) would reach.

An independent head reads the state of the last verified token t and drafts slot t+1+j (j = 1..m)
without seeing the tokens in between: the target has yet to draw slot t+1 itself. Trained on the
target's own continuations (`train_rows=generated`) with a cross-entropy loss, its best law is the
target's marginal of that slot given x≤t:

    m_j(y) = E[ p_T(y | x≤t, X_{t+1..t+j}) ]   over continuations X drawn from the target at temperature T.

`marginal_laws` estimates m_1..m_m without bias by averaging the target's whole next-token laws along
N sampled paths (each path contributes a law, not only the token it drew). `oracle_decode` drafts from
those laws and accepts with lab.decode_core.acceptance, so what it emits has the target's law exactly;
its tokens per target forward are the ceiling of the training objective, the number a head's own
rate is a share of. The estimate's noise errs low: for one draft, the acceptance Σ_y min(p(y), q(y))
is concave in q, so an unbiased noisy q accepts no more often, on average, than the exact marginal.

Greedy (T = 0): every path is the greedy continuation, the laws are point masses on it, and every
draft passes: tokens per forward is m + 1 until the budget ends (the test of the bookkeeping).
"""

from __future__ import annotations

import torch

from lab.decode.generated_rows import next_token_is_the_trunks
from lab.errors import require
from lab.decode_core.acceptance import select
from lab.decode_core.ledger import acceptance_conventions
from lab.decode_core.sampling import TokenChooser


def target_model(model):
    """The transformers model that is `model`'s next-token path (the oracle runs its KV cache)."""
    require(model.trunk.transformers_model is not None and next_token_is_the_trunks(model), "model",
            "the marginal oracle needs a transformers trunk whose next-token path is its own (medusa, deepseek, ntp heads)")
    return model.hf_model


@torch.no_grad()
def marginal_laws(hf_model, context: list[int], depth: int, paths: int, chooser: TokenChooser) -> tuple[list[int], list[torch.Tensor | None]]:
    """(drafts, laws): for j = 1..depth, a draft of slot t+1+j and the [V] float64 law it was drawn from
    (None when greedy: the draft is the greedy path's token). `context` ends at the last verified token t."""
    from transformers import DynamicCache

    cache = DynamicCache()
    out = hf_model(input_ids=torch.tensor([context]), cache=cache, use_cache=True)
    cache.batch_repeat_interleave(paths)  # N copies of the context's keys and values
    logits = out.logits[:, -1].expand(paths, -1)  # [N, V]: every path starts from the law of slot t+1
    drafts, laws = [], []
    for _ in range(depth):
        if chooser.greedy:
            step = logits.argmax(dim=-1, keepdim=True)  # [N, 1]: all paths are the greedy one
        else:
            probs = chooser.probs(logits)  # [N, V] float64
            step = torch.tensor([[chooser.draws.sample(row)] for row in probs])  # [N, 1]: one token per path
        logits = hf_model(input_ids=step, cache=cache, use_cache=True).logits[:, -1]  # [N, V]: law of the next slot
        if chooser.greedy:
            drafts.append(int(logits[0].argmax())), laws.append(None)
        else:
            law = chooser.probs(logits).mean(dim=0)  # [V]: the Rao-Blackwellised marginal of this slot
            drafts.append(chooser.draws.sample(law)), laws.append(law)
    return drafts, laws


@torch.no_grad()
def oracle_decode(model, prompt: list[int], new_tokens: int, depth: int, paths: int, chooser: TokenChooser) -> dict:
    """Decode `new_tokens` tokens after `prompt` with `depth` oracle drafts per round.

    Returns the tokens, target forwards (the prefill included, as lab.decode counts them), tokens per
    forward, the drafts proposed and accepted by round, and the acceptance of each draft position in
    lab.decode's two conventions."""
    require(depth >= 1 and paths >= 1 and new_tokens >= 1, "oracle", f"needs depth, paths and new_tokens ≥ 1, got {depth}, {paths}, {new_tokens}")
    hf_model = target_model(model)
    context = list(prompt)
    pending, _ = chooser.choose(hf_model(input_ids=torch.tensor([context])).logits[0, -1])  # the prefill's token
    emitted, forwards, proposed, accepted = [pending], 1, [], []
    while len(emitted) < new_tokens:
        m = min(depth, new_tokens - len(emitted) - 1)  # drafts that still fit before the budget's last token
        drafts, laws = marginal_laws(hf_model, context, m, paths, chooser) if m else ([], [])
        verified = torch.tensor([context + [pending] + drafts])  # [1, L+1+m]
        target_logits = hf_model(input_ids=verified).logits[0, len(context):]  # [m+1, V]: row i predicts draft i's slot
        j, following = select(drafts, laws, target_logits, chooser)
        context += [pending] + drafts[:j]
        emitted += drafts[:j] + [following]
        pending, forwards = following, forwards + 1
        proposed.append(m), accepted.append(j)
    return {"tokens": emitted[:new_tokens], "target_forwards": forwards, "tokens_per_forward": len(emitted) / forwards,
            "proposed_by_round": proposed, "accepted_by_round": accepted, **acceptance_conventions(proposed, accepted, depth)}

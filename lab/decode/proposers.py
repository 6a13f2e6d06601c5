"""Draft proposers: who suggests the tokens that the target verifies.

- `IndependentHeads` (linear, parallel, causal, anticausal): at the last committed row,
  head k predicts the token k−1 places after the frontier (blockwise parallel decoding).
  Their rows come out of the same target pass that verifies (the heads' stacks keep
  their own caches, committed with the target's verified rows).
- `DeepSeekChain`: the carried-frontier chain of M7.6 §0x09. Draft step s runs depth
  module s (module (s−1) mod D + 1 beyond D, the vLLM rule) at the last committed row,
  fed the previous step's state and the embedding of the latest token (frontier, then the
  previous draft). Each step owns a cache; its rows are final once every token they
  consumed is emitted output, and provisional otherwise. Provisional rows are dropped
  after every round, and the next round recomputes the rows that became final from
  committed state only (reseed), so no row that saw a rejected token survives.

A proposer answers `propose(tokens, frontier, m, chooser) -> (drafts, their distributions)`
and `after_verify(target_pass, kept)` (called before the target commits `kept` rows).
"""

from __future__ import annotations

import torch

from lab.decode.sampling import TokenChooser
from lab.errors import require
from lab.decode.target import CachedModel, TargetPass


class IndependentHeads:
    def __init__(self, state: CachedModel, draft_steps: int | None):
        self.state, self.model = state, state.model
        heads = self.model.k - 1  # one draft per extra horizon
        require(draft_steps is None or draft_steps <= heads, "draft_steps", f"must be ≤ {heads} (this K={self.model.k} model drafts with its {heads} extra heads), got {draft_steps}")
        self.max_drafts = heads if draft_steps is None else draft_steps
        self.next_logits: torch.Tensor | None = None  # [K-1, V] horizons 2..K at the last committed row

    def after_verify(self, target_pass: TargetPass, kept: int) -> None:
        rows = list(target_pass.more_horizons)  # (K-1) × [1, n, d]: runs (and caches) the draft stacks
        last = kept - 1  # the last row the target commits
        self.next_logits = torch.stack([self.model.horizon_logits(k, r[0, last]) for k, r in enumerate(rows, start=2)])  # [K-1, V]
        self.state.caches.commit(kept, family="draft")

    def propose(self, tokens: list[int], frontier: int, m: int, chooser: TokenChooser):
        drafts, probs = [], []
        for i in range(m):  # head i + 2 predicts the slot i + 1 places after the frontier
            token, q = chooser.choose(self.next_logits[i])
            drafts.append(token), probs.append(q)
        return drafts, probs


class DeepSeekChain:
    def __init__(self, state: CachedModel, draft_steps: int | None):
        self.state, self.model, self.head = state, state.model, state.model.head
        self.max_drafts = self.head.depth if draft_steps is None else draft_steps
        self.seed_rows = []  # chunks [n_i, d] of the chain's input at committed target rows
        self.final_rows: dict[int, torch.Tensor] = {}  # step s -> [L_s, d] outputs of its final rows

    def after_verify(self, target_pass: TargetPass, kept: int) -> None:
        self.seed_rows.append(self.head.chain_input(target_pass.hidden[:kept], self.model.shared_parts()))  # [kept, d]
        self.state.caches.discard(family="draft")  # provisional step rows consumed drafts: never kept

    def _run(self, step: int, previous: torch.Tensor, teachers: list[int]) -> torch.Tensor:
        """Append rows to step `step`'s cache: previous [n, d] states, teacher token ids [n] -> [n, d]."""
        ids = torch.tensor(teachers, dtype=torch.long, device=previous.device)[None]  # [1, n]
        ctx = self.state.caches.context(("step", step), len(teachers), previous.device)
        module = self.head.chain_module(step)
        return module(previous[None], self.model.trunk.embed(ids), ctx)[0]  # [n, d]

    def propose(self, tokens: list[int], frontier: int, m: int, chooser: TokenChooser):
        self.seed_rows = [torch.cat(self.seed_rows)] if len(self.seed_rows) > 1 else self.seed_rows
        n = len(tokens)  # committed target rows 0..n-1; the frontier is token n
        known = tokens + [frontier]  # token ids 0..n, all emitted output
        previous_final, previous_all = self.seed_rows[0], self.seed_rows[0]  # step 0 = the target's rows [n, d]
        drafts, probs, self.draft_logits = [], [], []
        for step in range(1, m + 1):
            cache = self.state.caches.cache(("step", step))
            # Row t of this step consumes token t + step: final when that token is emitted output.
            final_len = max(0, min(n, n - step + 1))
            finals = self.final_rows.get(step, previous_final[:0])  # [L, d]
            if final_len > cache.committed:
                start = cache.committed
                new = self._run(step, previous_final[start:final_len], known[start + step : final_len + step])  # [final_len-start, d]
                cache.commit()
                finals = self.final_rows[step] = torch.cat([finals, new])  # [final_len, d]
            rows = finals[:final_len]  # [final_len, d]
            if final_len < n:  # rows final_len..n-1 consume drafts: provisional
                path = known + drafts  # token ids 0 .. n + step - 1
                provisional = self._run(step, previous_all[final_len:n], path[final_len + step : n + step])  # [n-final_len, d]
                rows = torch.cat([rows, provisional])  # [n, d]
            logits = self.model.horizon_logits(step + 1, rows[-1])  # [V]: row n-1 drafts slot n + step
            self.draft_logits.append(logits)
            token, q = chooser.choose(logits)
            drafts.append(token), probs.append(q)
            previous_final, previous_all = finals, rows
        return drafts, probs


def build_proposer(state: CachedModel, draft_steps: int | None):
    """The head's proposer (head classes say which through `draft_proposer`)."""
    kind = getattr(state.model.head, "draft_proposer", None)
    if kind is None:
        return None
    return PROPOSERS[kind](state, draft_steps)


PROPOSERS = {"independent": IndependentHeads, "chain": DeepSeekChain}

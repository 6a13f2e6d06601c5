"""DeepSeek's drafter: the carried-frontier chain (docs/decoding.md).

Draft step s runs depth module s (module (s−1) mod D + 1 beyond D, the vLLM rule) at the last
committed row, fed the previous step's state and the embedding of the latest token (frontier,
then the previous draft). Each step owns a cache; its rows are final once every token they
consumed is emitted output, and provisional otherwise. Provisional rows are dropped after
every round, and the next round recomputes the rows that became final from committed state
only (reseed), so no row that saw a rejected token survives.

Written against the decoding core's model-free modules (tree, sampling, proposer) and the
`ChainHead` members below, so lab/model/heads/deepseek/head.py can declare it without a cycle.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch
import torch.nn as nn

from lab.decode_core.proposer import head_identity, vocab_identity
from lab.decode_core.sampling import TokenChooser
from lab.decode_core.tree import ProposalBuffer, TreeShape, build_buffer
from lab.nn.draft_vocab import draft_rows_of, logits_on_rows


class ChainHead(Protocol):
    """What the chain asks of its head (lab.model.heads.deepseek.DeepSeekHead answers it)."""

    depth: int  # D, the depth modules
    chain_steps: int  # steps the chain was trained for (D, or head.rollout_steps): drafts per round unless `draft_steps` says otherwise

    def chain_input(self, trunk_hidden: torch.Tensor, shared) -> torch.Tensor:
        """[n, d] trunk rows (before the final norm) -> [n, d] the state depth 1 reads."""

    def chain_module(self, step: int) -> nn.Module:
        """The module of draft step `step` (1-based): f(previous [1, n, d], teacher embeddings [1, n, d], ctx) -> [1, n, d]."""

    def next_depth_input(self, state: torch.Tensor, shared) -> torch.Tensor:
        """[..., d] one depth's output rows -> [..., d] what the next depth reads."""


class DeepSeekChain:
    """The drafter of `DeepSeekHead`: step s of a round drafts slot s after the frontier with depth module s."""

    drafts_trees = False  # one sequential chain: step s needs step s − 1's draft
    drafts_batches = False  # per-step caches whose rows depend on each request's drafts

    def __init__(self, state, draft_steps: int | None):
        self.state, self.model = state, state.model  # a lab.decode_core.target.CachedModel and its model
        self.head: ChainHead = state.model.head
        self.max_drafts = self.head.chain_steps if draft_steps is None else draft_steps
        self.seed_rows = []  # chunks [n_i, d] of the chain's input at committed target rows
        self.final_rows: dict[int, torch.Tensor] = {}  # step s -> [L_s, d] outputs of its final rows
        self.draft_blocks_s = 0.0  # time inside the depth modules (the ledger's draft blocks)
        self.projections: dict[int, torch.Tensor] = {}  # horizon k -> [V or N, d] its projection's draft rows (`step_logits`)

    def after_verify(self, target_pass, rows: list[int]) -> None:
        self.seed_rows.append(self.head.chain_input(target_pass.hidden[rows], self.model.shared_parts()))  # [kept, d]
        self.state.caches.discard(family="draft")  # provisional step rows consumed drafts: never kept

    def _run(self, step: int, previous: torch.Tensor, teachers: list[int]) -> torch.Tensor:
        """Append rows to step `step`'s cache: previous [n, d] states, teacher token ids [n] -> [n, d]."""
        ids = torch.tensor(teachers, dtype=torch.long, device=previous.device)[None]  # [1, n]
        ctx = self.state.caches.context(("step", step), len(teachers), previous.device)
        module = self.head.chain_module(step)
        start = time.perf_counter()
        rows = module(previous[None], self.model.trunk.embed(ids), ctx)[0]  # [n, d]
        self.draft_blocks_s += time.perf_counter() - start
        return rows

    def step_logits(self, k: int, row: torch.Tensor) -> torch.Tensor:
        """[d] a depth's row -> [V] horizon k's logits (as `MTPModel.horizon_logits`), with the draft vocabulary's
        projection rows gathered once per request instead of at every draft step."""
        if k not in self.projections:
            self.projections[k] = draft_rows_of(self.head.projection(k, self.model.shared_parts()).detach(), self.model.draft_ids)  # [V or N, d]
        return logits_on_rows(self.model.trunk.final_norm(row), self.projections[k], self.model.draft_ids, self.model.trunk.unembedding.shape[0])  # [V]

    def propose(self, tokens: list[int], frontier: int, m: int, chooser: TokenChooser) -> ProposalBuffer:
        drafts, probs = self.draft_chain(tokens, frontier, m, chooser)
        laws = [None if q is None else q[None] for q in probs]  # [1, V]: one candidate per position
        return build_buffer(TreeShape.chain(m), frontier, [[t] for t in drafts], laws, torch.stack(self.draft_logits), self.state.length,
                            head_identity(self.model), vocab_identity(self.model))

    def draft_chain(self, tokens: list[int], frontier: int, m: int, chooser: TokenChooser):
        """(drafts, the [V] law each was drawn from (None when greedy)); the steps' logits stay in `draft_logits`."""
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
            logits = self.step_logits(step + 1, rows[-1])  # [V]: row n-1 drafts slot n + step
            self.draft_logits.append(logits)
            token, q = chooser.choose(logits)
            drafts.append(token), probs.append(q)
            shared = self.model.shared_parts()
            previous_final, previous_all = self.head.next_depth_input(finals, shared), self.head.next_depth_input(rows, shared)  # [final_len, d], [n, d]
        return drafts, probs

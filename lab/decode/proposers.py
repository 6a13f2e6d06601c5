"""Draft proposers: who suggests the tokens that the target verifies.

- `IndependentHeads` (linear, parallel, causal, anticausal): at the last committed row,
  head k predicts the token k−1 places after the frontier (blockwise parallel decoding).
  Their rows come out of the same target pass that verifies (the heads' stacks keep
  their own caches, committed with the target's verified rows).
- `DeepSeekChain`: the carried-frontier chain (docs/decoding.md). Draft step s runs depth
  module s (module (s−1) mod D + 1 beyond D, the vLLM rule) at the last committed row,
  fed the previous step's state and the embedding of the latest token (frontier, then the
  previous draft). Each step owns a cache; its rows are final once every token they
  consumed is emitted output, and provisional otherwise. Provisional rows are dropped
  after every round, and the next round recomputes the rows that became final from
  committed state only (reseed), so no row that saw a rejected token survives.

- Independent heads run their draft stacks as one batched forward per round (the head's
  `decode_drafter`) and project every horizon in one call; identity heads reuse the
  next-token logits. With a draft tree they propose several ranked candidates per slot.

A proposer answers `propose(tokens, frontier, m, chooser) -> ProposalBuffer` and
`after_verify(target_pass, rows)` (called before the target commits the pass's rows `rows`).
"""

from __future__ import annotations

import time

import torch

from lab.decode.ngram import HeadsWithNgram, NgramProposer, PromptLookup
from lab.decode.sampling import TokenChooser
from lab.decode.target import CachedModel, TargetPass
from lab.decode.tree import ProposalBuffer, TreeShape, build_buffer, ranked_candidates
from lab.errors import ConfigError, require
from lab.model.draft_vocab import draft_logits, scatter_to_vocab


class IndependentHeads:
    def __init__(self, state: CachedModel, draft_steps: int | None, tree: TreeShape | None = None):
        self.state, self.model, self.head = state, state.model, state.model.head
        heads = self.model.k - 1  # one draft per extra horizon
        require(draft_steps is None or draft_steps <= heads, "draft_steps", f"must be ≤ {heads} (this K={self.model.k} model drafts with its {heads} extra heads), got {draft_steps}")
        self.max_drafts = heads if draft_steps is None else draft_steps
        self.tree = tree
        self.drafter = self.head.decode_drafter()  # one batched forward of the draft stacks (built once per request)
        self.projections = None  # [K-1, V, d] replicated draft projections ([K-1, N, d] under a draft vocabulary), one bmm
        if self.head.projections is not None:  # each head says which projection serves horizon k (medusa keeps the trunk's for k = 1)
            shared = self.model.shared_parts()
            self.projections = torch.stack([self.head.projection(k, shared).detach() for k in range(2, self.model.k + 1)])
        self.draft_ids, self.vocab_size = self.model.draft_ids, self.model.trunk.unembedding.shape[0]  # [N] or None: all V
        if self.projections is not None and self.draft_ids is not None:
            self.projections = self.projections[:, self.draft_ids]  # [K-1, N, d]: sliced once per request, not per round
        self.next_logits: torch.Tensor | None = None  # [K-1, V] horizons 2..K at the last committed row
        self.identity, self.vocab = head_identity(self.model), vocab_identity(self.model)
        self.draft_blocks_s = 0.0

    def draft_logits(self, rows: torch.Tensor) -> torch.Tensor:
        """[G, d] draft rows at one position -> [K-1, V] logits, every horizon in one projection call."""
        normed = self.model.trunk.final_norm(rows)  # [G, d]
        if self.projections is None:
            return draft_logits(normed, self.model.trunk.unembedding, self.draft_ids).expand(self.model.k - 1, -1)  # [K-1, V]
        logits = torch.bmm(self.projections, normed.expand(self.model.k - 1, -1)[..., None])[..., 0]  # [K-1, V or N]
        return logits if self.draft_ids is None else scatter_to_vocab(logits, self.draft_ids, self.vocab_size)  # [K-1, V]

    def after_verify(self, target_pass: TargetPass, rows: list[int]) -> None:
        last = rows[-1]  # the last row the target commits
        if self.head.drafts_reuse_next_token_logits:
            logits = target_pass.logits_at(last)  # [V]
            if self.draft_ids is not None:  # a draft vocabulary holds for identity heads too (batched decoding projects them so)
                logits = scatter_to_vocab(logits[self.draft_ids], self.draft_ids, self.vocab_size)  # [N] -> [V]
            self.next_logits = logits.expand(self.model.k - 1, -1)  # [K-1, V]
            return
        start = time.perf_counter()
        if self.head.drafts_read_trunk_rows and len(rows) < target_pass.hidden.shape[0]:
            # Rows were rejected (siblings, or drafts after a mismatch): run the draft stacks on the
            # committed rows' trunk states only, as one causal chunk.
            path_hidden = target_pass.hidden[rows][None]  # [1, a, d]
            draft_rows = self.drafter(path_hidden, None, self.state.caches.contexts(len(rows), path_hidden.device))  # [G, a, d]
            last, rows = len(rows) - 1, list(range(len(rows)))
        else:
            draft_rows = self.drafter(target_pass.hidden[None], target_pass.more_horizons, target_pass.ctx_for)  # [G, n, d]
        self.draft_blocks_s += time.perf_counter() - start
        self.next_logits = self.draft_logits(draft_rows[:, last])  # [K-1, V]
        self.state.caches.commit_rows(rows, family="draft")

    def propose(self, tokens: list[int], frontier: int, m: int, chooser: TokenChooser) -> ProposalBuffer:
        """Head i + 2 proposes the slot i + 1 places after the frontier; a tree takes several ranked candidates per slot."""
        shape = TreeShape.chain(m) if self.tree is None else self.tree.limited(m)
        candidates, laws = ranked_candidates(self.next_logits, shape.widths, chooser, vocab_limited=self.draft_ids is not None)
        return build_buffer(shape, frontier, candidates, laws, self.next_logits, self.state.length, self.identity, self.vocab)


class DeepSeekChain:
    def __init__(self, state: CachedModel, draft_steps: int | None):
        self.state, self.model, self.head = state, state.model, state.model.head
        self.max_drafts = self.head.depth if draft_steps is None else draft_steps
        self.seed_rows = []  # chunks [n_i, d] of the chain's input at committed target rows
        self.final_rows: dict[int, torch.Tensor] = {}  # step s -> [L_s, d] outputs of its final rows
        self.draft_blocks_s = 0.0  # time inside the depth modules (the ledger's draft blocks)

    def after_verify(self, target_pass: TargetPass, rows: list[int]) -> None:
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
            logits = self.model.horizon_logits(step + 1, rows[-1])  # [V]: row n-1 drafts slot n + step
            self.draft_logits.append(logits)
            token, q = chooser.choose(logits)
            drafts.append(token), probs.append(q)
            shared = self.model.shared_parts()
            previous_final, previous_all = self.head.next_depth_input(finals, shared), self.head.next_depth_input(rows, shared)  # [final_len, d], [n, d]
        return drafts, probs


def head_identity(model) -> str:
    """Which head and weights proposed: the architecture, K, and the checkpoint's identity when it was loaded from one."""
    return f"{model.head_cfg.name} K={model.k}" + (f" {model.identity}" if getattr(model, "identity", None) else "")


def vocab_identity(model) -> str:
    return f"V={model.model_cfg.vocab_size}"


def build_proposer(state: CachedModel, draft_steps: int | None, tree: TreeShape | None = None, ngram: PromptLookup | None = None):
    """The head's proposer (head classes say which through `draft_proposer`); `tree` for independent heads only;
    with `ngram`, prompt lookup alone (no draft heads, or `ngram.with_heads` off) or merged into the heads' proposals."""
    heads = heads_proposer(state, draft_steps, tree) if ngram is None or ngram.with_heads else None
    if ngram is None:
        return heads
    require(tree is None or heads is not None, "tree", "shapes the draft heads' candidates; prompt lookup alone drafts one chain (use tree=None)")
    lookup = NgramProposer(state, ngram, vocab_identity(state.model))
    return lookup if heads is None or heads.max_drafts < 1 else HeadsWithNgram(heads, lookup)


def heads_proposer(state: CachedModel, draft_steps: int | None, tree: TreeShape | None):
    kind = getattr(state.model.head, "draft_proposer", None)
    if kind is None:
        return None
    if tree is not None and kind != "independent":
        raise ConfigError("tree", f"head '{state.model.head_cfg.name}' drafts a sequential chain; draft trees need independent heads "
                          "(linear, parallel, causal, anticausal, identity); use tree=None")
    return PROPOSERS[kind](state, draft_steps, tree) if tree is not None else PROPOSERS[kind](state, draft_steps)


PROPOSERS = {"independent": IndependentHeads, "chain": DeepSeekChain}

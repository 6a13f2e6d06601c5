"""The drafter of independent heads (linear, parallel, causal, anticausal, identity, medusa).

At the last committed row, head k predicts the token k−1 places after the frontier (blockwise
parallel decoding). Their rows come out of the same target pass that verifies (the heads'
stacks keep their own caches, committed with the target's verified rows). The draft stacks run
as one batched forward per round (the head's `decode_drafter`) and every horizon is projected
in one call; identity heads reuse the next-token logits. With a draft tree they propose several
ranked candidates per slot.

A batch of requests drafts with the same parts (`IndependentHeads.for_batch`): the projection, and the
proposal from one row's [K-1, V] logits (`propose_from`), each row reading its own slot of the shared pass
(lab/decode/batched_speculative.py).

Written against the decoding core's model-free modules (tree, sampling, proposer) and the
decoding members of `MTPHead`, so lab/model/heads/base.py can declare it without a cycle.
"""

from __future__ import annotations

import time

import torch

from lab.errors import require
from lab.decode_core.proposer import head_identity, vocab_identity
from lab.decode_core.sampling import TokenChooser
from lab.decode_core.tree import ProposalBuffer, TreeShape, build_buffer, ranked_candidates
from lab.nn.draft_vocab import draft_rows_of, logits_on_rows, scatter_to_vocab


class DraftProjection:
    """Rows of draft horizons 2..K -> their logits over the whole vocabulary, every horizon in one projection call.

    The weights are taken once per request or batch: the replicated projections stacked ([K-1, V, d]), and under a
    draft vocabulary cut to its N rows (a gather of N × d numbers, too large to repeat every round on a 49k
    vocabulary). One request projects [G, d] rows at one position (G = K-1, or 1 when every draft horizon reads the
    same rows); a batch projects [K-1, B, d], each row at its own slot (lab/decode/batched_speculative.py).
    """

    def __init__(self, model):
        self.final_norm, self.horizons = model.trunk.final_norm, model.k - 1
        self.draft_ids, self.vocab_size = model.draft_ids, model.trunk.unembedding.shape[0]  # [N] or None: all V
        self.replicated = None  # [K-1, V or N, d]: each head says which projection serves horizon k (medusa keeps the trunk's for k = 1)
        if model.head.projections is not None:
            shared = model.shared_parts()
            self.replicated = torch.stack([model.head.projection(k, shared).detach() for k in range(2, model.k + 1)])  # [K-1, V, d]
            if self.draft_ids is not None:
                self.replicated = self.replicated[:, self.draft_ids]  # [K-1, N, d]
        self.shared = draft_rows_of(model.trunk.unembedding.detach(), self.draft_ids)  # [V or N, d]

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """[G, d] -> [K-1, V] (one request) or [K-1, B, d] -> [K-1, B, V] (a batch)."""
        normed = self.final_norm(rows)  # [G, d] or [K-1, B, d]
        if normed.dim() == 3:  # a batch: one matmul on the shared unembedding, one bmm on replicated ones
            weights = self.shared.T if self.replicated is None else self.replicated.transpose(1, 2)  # [d, N] or [K-1, d, N]
            logits = normed @ weights if self.replicated is None else torch.bmm(normed, weights)  # [K-1, B, V or N]
        elif self.replicated is None:  # G = 1 (identity rows) or K-1 rows, one shared projection
            return logits_on_rows(normed, self.shared, self.draft_ids, self.vocab_size).expand(self.horizons, -1)  # [K-1, V]
        else:
            logits = torch.bmm(self.replicated, normed.expand(self.horizons, -1)[..., None])[..., 0]  # [K-1, V or N]
        return logits if self.draft_ids is None else scatter_to_vocab(logits, self.draft_ids, self.vocab_size)  # [..., V]


def propose_from(next_logits: torch.Tensor, shape: TreeShape, frontier: int, chooser: TokenChooser, version: int, identity: str,
                 vocab: str, vocab_limited: bool) -> ProposalBuffer:
    """Horizons 2..K's logits [K-1, V] -> the proposal: head i + 2's ranked candidates at the slot i + 1 after the frontier."""
    candidates, laws = ranked_candidates(next_logits, shape.widths, chooser, vocab_limited=vocab_limited)
    return build_buffer(shape, frontier, candidates, laws, next_logits, version, identity, vocab)


class BatchDrafts:
    """The independent heads' drafts for B requests that share every target pass: each row's horizons 2..K are read at
    that row's last kept slot and projected in one call; each row proposes as a single request would."""

    def __init__(self, model):
        self.project = DraftProjection(model)
        self.identity, self.vocab, self.vocab_limited = head_identity(model), vocab_identity(model), model.draft_ids is not None

    def next_logits(self, horizons: list[torch.Tensor], slot: torch.Tensor) -> torch.Tensor:
        """Horizons K × [B, n, d] and each row's slot [B] -> horizons 2..K's logits there [B, K-1, V]."""
        rows = torch.arange(slot.shape[0], device=slot.device)  # [B]
        draft_rows = torch.stack([h[rows, slot] for h in horizons[1:]])  # [K-1, B, d]
        return self.project(draft_rows).transpose(0, 1)  # [B, K-1, V]

    def propose(self, next_logits: torch.Tensor, frontier: int, m: int, chooser: TokenChooser) -> ProposalBuffer:
        """One row's chain of `m` drafts from its [K-1, V] logits (the batch keeps no prefix version: version 0)."""
        return propose_from(next_logits, TreeShape.chain(m), frontier, chooser, 0, self.identity, self.vocab, self.vocab_limited)


class IndependentHeads:
    """The drafter of heads whose horizons 2..K read the target pass's rows (`MTPHead.horizon_rows`)."""

    drafts_trees = True  # ranked candidates per slot
    drafts_batches = True  # every row of a batch reads its own slot of the shared pass

    def __init__(self, state, draft_steps: int | None, tree: TreeShape | None = None):
        self.state, self.model, self.head = state, state.model, state.model.head  # a lab.decode_core.target.CachedModel, its model and head
        heads = self.model.k - 1  # one draft per extra horizon
        require(draft_steps is None or draft_steps <= heads, "draft_steps", f"must be ≤ {heads} (this K={self.model.k} model drafts with its {heads} extra heads), got {draft_steps}")
        self.max_drafts = heads if draft_steps is None else draft_steps
        self.tree = tree
        self.drafter = self.head.decode_drafter()  # one batched forward of the draft stacks (built once per request)
        self.draft_logits = DraftProjection(self.model)  # [G, d] draft rows at one position -> [K-1, V]
        self.draft_ids, self.vocab_size = self.model.draft_ids, self.model.trunk.unembedding.shape[0]  # [N] or None: all V
        self.next_logits: torch.Tensor | None = None  # [K-1, V] horizons 2..K at the last committed row
        self.identity, self.vocab = head_identity(self.model), vocab_identity(self.model)
        self.draft_blocks_s = 0.0

    def after_verify(self, target_pass, rows: list[int]) -> None:
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
        return propose_from(self.next_logits, shape, frontier, chooser, self.state.length, self.identity, self.vocab, self.draft_ids is not None)

    @staticmethod
    def for_batch(model) -> BatchDrafts:
        """These heads' drafts for a batch of requests (`drafts_batches`)."""
        return BatchDrafts(model)

"""The proposer protocol: what the decoder asks of whoever suggests the tokens the target verifies.

A head declares its drafter class on `MTPHead.drafter` (lab/model/heads/base.py), read into its `HeadSpec`; prompt lookup
(lab/decode/ngram.py) answers the same `Proposer` protocol. This module imports no model code,
so a head's drafter can import it (and tree, sampling) without an import cycle.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from lab.decode_core.sampling import TokenChooser
from lab.decode_core.tree import ProposalBuffer


class Proposer(Protocol):
    """One request's drafter."""

    max_drafts: int  # drafts per round at most

    def after_verify(self, target_pass, rows: list[int]) -> None:
        """Called before the target commits the pass's rows `rows` (`target_pass`: a lab.decode_core.target.TargetPass)."""

    def propose(self, tokens: list[int], frontier: int, m: int, chooser: TokenChooser) -> ProposalBuffer:
        """Up to `m` drafts after the frontier token, given the committed `tokens`."""


class HeadDrafter(Proposer, Protocol):
    """A head's drafter, built as `drafter(state, draft_steps)` (`state`: the request's lab.decode_core.target.CachedModel;
    `draft_steps`: drafts per round, None for every one the head has), or `drafter(state, draft_steps, tree)` when it drafts trees."""

    # Its drafts come as ranked candidates per slot, so a draft tree (lab.decode_core.tree.TreeShape) can shape them.
    drafts_trees: ClassVar[bool]
    # Its drafts are read from the rows of the target pass alone, so the requests of a batch can draft in one pass;
    # such a drafter's `for_batch(model)` gives the batch's drafts (projection and per-row proposal, its own parts).
    drafts_batches: ClassVar[bool]
    draft_blocks_s: float  # seconds inside the draft blocks so far (the ledger's draft time)


def head_identity(model) -> str:
    """Which head and weights proposed: the architecture, K, and the checkpoint's identity when it was loaded from one."""
    return f"{model.head_cfg.name} K={model.k}" + (f" {model.identity}" if getattr(model, "identity", None) else "")


def vocab_identity(model) -> str:
    return f"V={model.model_cfg.vocab_size}"

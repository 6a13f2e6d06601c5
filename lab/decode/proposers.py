"""Which proposer a request drafts with: the head's own drafter, prompt lookup, or both merged.

A head declares its drafter class on `MTPHead.drafter`, read into its `HeadSpec` (lab/model/heads/independent_drafter.py,
lab/model/heads/deepseek/drafter.py); every proposer answers lab.inference.proposer.Proposer.
"""

from __future__ import annotations

from lab.decode.ngram import HeadsWithNgram, NgramProposer, PromptLookup
from lab.errors import ConfigError, require
from lab.inference.proposer import vocab_identity
from lab.inference.target import CachedModel
from lab.inference.tree import TreeShape
from lab.model.heads import head_spec, heads_that


def build_proposer(state: CachedModel, draft_steps: int | None, tree: TreeShape | None = None, ngram: PromptLookup | None = None):
    """The head's proposer (its class's `drafter`); `tree` for drafters of ranked candidates only;
    with `ngram`, prompt lookup alone (no draft heads, or `ngram.with_heads` off) or merged into the heads' proposals."""
    heads = heads_proposer(state, draft_steps, tree) if ngram is None or ngram.with_heads else None
    if ngram is None:
        return heads
    require(tree is None or heads is not None, "tree", "shapes the draft heads' candidates; prompt lookup alone drafts one chain (use tree=None)")
    lookup = NgramProposer(state, ngram, vocab_identity(state.model))
    return lookup if heads is None or heads.max_drafts < 1 else HeadsWithNgram(heads, lookup)


def heads_proposer(state: CachedModel, draft_steps: int | None, tree: TreeShape | None):
    drafter = head_spec(state.model.head_cfg.name).drafter
    if drafter is None:
        return None
    if tree is None:
        return drafter(state, draft_steps)
    if not drafter.drafts_trees:
        raise ConfigError("tree", f"head '{state.model.head_cfg.name}' drafts a sequential chain; draft trees need independent heads "
                          f"({', '.join(heads_that('drafts_trees'))}); use tree=None")
    return drafter(state, draft_steps, tree)

"""Which proposer a request drafts with: the head's own drafter, prompt lookup, or both merged.

A head declares its drafter class on `MTPHead.drafter`, read into its `HeadSpec` (lab/model/heads/independent_drafter.py,
lab/model/heads/deepseek/drafter.py); every proposer answers lab.decode_core.proposer.Proposer.
"""

from __future__ import annotations


from lab.decode.choose import ChoosePerRound, ConfidenceGated
from lab.decode.ngram import HeadsWithNgram, NgramProposer, PromptLookup
from lab.decode.suffix import SuffixProposer
from lab.errors import ConfigError, is_number, require
from lab.decode_core.proposer import vocab_identity
from lab.decode_core.target import CachedModel
from lab.decode_core.tree import TreeShape
from lab.model.heads import head_spec, heads_that

LOOKUPS = {"ngram": NgramProposer, "suffix": SuffixProposer}  # PromptLookup.method -> its proposer
COMBINERS = {  # PromptLookup.combine -> the proposer of heads and lookup together
    "graft": lambda heads, lookup, settings: HeadsWithNgram(heads, lookup),
    "choose": lambda heads, lookup, settings: ChoosePerRound(heads, lookup, settings.min_match),
}


def build_proposer(state: CachedModel, draft_steps: int | None, tree: TreeShape | None = None, ngram: PromptLookup | None = None,
                   confidence: float | None = None):
    """The head's proposer (its class's `drafter`); `tree` for drafters of ranked candidates only; `confidence`: the heads'
    drafts below that probability dropped. With `ngram`, a lookup proposer (n-gram or suffix) alone (no draft heads, or
    `ngram.with_heads` off), grafted into the heads' proposals, or chosen per round (`ngram.combine`)."""
    heads = heads_proposer(state, draft_steps, tree) if ngram is None or ngram.with_heads else None
    has_heads = heads is not None and heads.max_drafts >= 1
    require(confidence is None or has_heads, "confidence", "gates the draft heads' proposals, and this request drafts without heads "
            "(a K = 1 model, or prompt lookup with with_heads=false); drop it")
    if confidence is not None:
        check_confidence(confidence)
        heads = ConfidenceGated(heads, confidence)
    if ngram is None:
        return heads
    require(tree is None or heads is not None, "tree", "shapes the draft heads' candidates; prompt lookup alone drafts one chain (use tree=None)")
    require(ngram.combine != "choose" or has_heads, "ngram.combine", "choose picks the lookup or the draft heads each round, and this "
            "request has no draft heads (a K = 1 model, or with_heads=false); allowed here: graft")
    lookup = LOOKUPS[ngram.method](state, ngram, vocab_identity(state.model))
    if not has_heads:
        return lookup
    return COMBINERS[ngram.combine](heads, lookup, ngram)


def check_confidence(confidence) -> None:
    require(is_number(confidence) and 0 < confidence < 1, "confidence", f"must be a probability in (0, 1) (a draft below it is not verified), got {confidence!r}")


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

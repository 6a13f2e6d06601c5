"""Zero-parameter heads: every horizon projects the trunk state itself.

Horizon k at row t sends the trunk's own row t through the shared final norm and
unembedding and is trained to predict tokens[t + offset_k] (the multi-token objective of
the modded-nanogpt speed-run record of 2025-12-22: a weighted average of next-k-token
losses on one set of logits). Nothing is added to the model; at K = 1 it is `ntp`.
As a draft proposer, horizon k's logits at the last row are simply the next-token
logits there, so the independent-head proposer drafts with them unchanged.
"""

from lab.errors import require
from lab.model.heads.base import MTPHead
from lab.model.heads.independent_drafter import IndependentHeads


class IdentityHead(MTPHead):
    drafter = IndependentHeads
    unused_options = ("n_layers", "init", "block")  # no head blocks
    drafts_reuse_next_token_logits = True  # shared norm and unembedding of the same rows: no draft projection at all

    @classmethod
    def check_config(cls, cfg):
        super().check_config(cfg)
        require(cfg.unembedding == "shared", "head.unembedding",
                "identity heads add no parameters; allowed: shared (head=linear head.unembedding=replicated gives each horizon its own V×d)")

    def horizon_rows(self, trunk_hidden, ctx_for, extra=None):
        yield trunk_hidden  # [B, S, d]: horizon 1
        for _ in range(self.k - 1):
            yield trunk_hidden if extra is None else extra  # [B, S, d]: every horizon reads the trunk state itself

    def decode_drafter(self):
        return lambda trunk_hidden, rest, ctx_for: trunk_hidden  # [1, n, d]: one row set for every horizon

"""Causal heads: head k consumes head k-1's hidden output (f_k ∘ … ∘ f_1 ∘ trunk)."""

from lab.model.heads.block_stack import BlockStackHead


class CausalHead(BlockStackHead):
    def recomputed_blocks(self) -> int:
        # detached: f_1 runs again on the detached trunk state to start horizons ≥ 2
        return self.cfg.n_layers if self.cfg.trunk_grad == "detached" and self.k > 1 else 0

    def horizon_rows(self, trunk_hidden, ctx_for, extra=None):
        rows = self.stacks[0](trunk_hidden, ctx_for(("stack", 0)))  # [B, S, d]: horizon 1
        yield rows
        if extra is not None and self.cfg.trunk_grad == "detached":
            # horizons ≥ 2 restart the chain from the detached trunk state: f_1 still learns from them, the trunk does not
            rows = self.stacks[0](extra, ctx_for(("stack", 0)))  # [B, S, d]
        for i in range(1, self.k):
            rows = self.stacks[i](rows, ctx_for(("stack", i)))  # [B, S, d]: f_{i+1} ∘ … ∘ f_1
            yield rows

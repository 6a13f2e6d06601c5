"""Causal heads: head k consumes head k-1's hidden output (f_k ∘ … ∘ f_1 ∘ trunk)."""

from lab.model.heads.block_stack import BlockStackHead


class CausalHead(BlockStackHead):
    def recomputed_blocks(self) -> int:
        # detached: f_1 runs again on the detached trunk state to start horizons ≥ 2
        return self.cfg.n_layers if self.cfg.trunk_grad == "detached" and self.k > 1 else 0

    def forward(self, trunk_hidden, batch, ctx, shared, n_horizons=None):
        n = self.horizons_to_run(n_horizons)
        first = self.stacks[0](trunk_hidden, ctx)  # [B, S, d]: horizon 1 rows
        # With a detached trunk, horizons ≥ 2 restart the chain from a detached trunk state,
        # so f_1 still learns from them but the trunk does not.
        rows = first if self.cfg.trunk_grad != "detached" or n == 1 else self.stacks[0](trunk_hidden.detach(), ctx)
        horizons = [self.endpoint(1, first, batch, shared)]
        for k in range(2, n + 1):
            rows = self.stacks[k - 1](rows, ctx)  # [B, S, d]: f_k ∘ … ∘ f_1
            horizons.append(self.endpoint(k, rows, batch, shared))
        return horizons

    def horizon_rows(self, trunk_hidden, ctx_for):
        rows = trunk_hidden
        for i, stack in enumerate(self.stacks):
            rows = stack(rows, ctx_for(("stack", i)))  # [B, S, d]: f_{i+1} ∘ … ∘ f_1
            yield rows

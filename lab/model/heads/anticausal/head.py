"""Anticausal heads: the farthest head runs first; horizon k uses f_k ∘ … ∘ f_K ∘ trunk."""

from lab.model.heads.block_stack import BlockStackHead


class AnticausalHead(BlockStackHead):
    @staticmethod
    def main_path_blocks(cfg):
        return cfg.k * cfg.n_layers  # horizon 1 sits at the end of the whole chain

    def recomputed_blocks(self) -> int:
        # detached: horizons ≥ 2 run f_K … f_2 again on the detached trunk state
        return (self.k - 1) * self.cfg.n_layers if self.cfg.trunk_grad == "detached" else 0

    def _chain(self, source, ctx, down_to: int) -> dict:
        """Rows of horizons K .. down_to, each the previous one pushed through its own stack."""
        rows, out = source, {}
        for k in range(self.k, down_to - 1, -1):
            rows = self.stacks[k - 1](rows, ctx)  # [B, S, d]: f_k ∘ … ∘ f_K
            out[k] = rows
        return out

    def next_token_stacks(self):
        return list(range(self.k - 1, -1, -1))  # horizon 1 runs through every stack, K first

    def horizon_rows(self, trunk_hidden, ctx_for):
        rows, out = trunk_hidden, {}
        for i in self.next_token_stacks():
            rows = self.stacks[i](rows, ctx_for(("stack", i)))  # [B, S, d]: f_{i+1} ∘ … ∘ f_K
            out[i + 1] = rows
        for k in range(1, self.k + 1):
            yield out[k]

    def forward(self, trunk_hidden, batch, ctx, shared, n_horizons=None):
        # Horizon 1 sits at the end of the whole chain, so every stack runs; a skipped horizon saves its projection only.
        n = self.horizons_to_run(n_horizons)
        rows = self._chain(trunk_hidden, ctx, down_to=1)
        if self.cfg.trunk_grad == "detached" and n > 1:
            # Horizons ≥ 2 get their own chain from a detached trunk state; horizon 1 keeps the attached one.
            rows = {**self._chain(trunk_hidden.detach(), ctx, down_to=2), 1: rows[1]}
        return [self.endpoint(k, rows[k], batch, shared) for k in range(1, n + 1)]

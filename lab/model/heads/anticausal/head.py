"""Anticausal heads: the farthest head runs first; horizon k uses f_k ∘ … ∘ f_K ∘ trunk."""

from lab.model.heads.block_stack import BlockStackHead


class AnticausalHead(BlockStackHead):
    @staticmethod
    def main_path_blocks(cfg):
        return cfg.k * cfg.n_layers  # horizon 1 sits at the end of the whole chain

    def recomputed_blocks(self) -> int:
        # detached: horizons ≥ 2 run f_K … f_2 again on the detached trunk state
        return (self.k - 1) * self.cfg.n_layers if self.cfg.trunk_grad == "detached" else 0

    def _chain(self, source, ctx_for, down_to: int) -> dict:
        """Rows of horizons K .. down_to, each the previous one pushed through its own stack."""
        rows, out = source, {}
        for k in range(self.k, down_to - 1, -1):
            rows = self.stacks[k - 1](rows, ctx_for(("stack", k - 1)))  # [B, S, d]: f_k ∘ … ∘ f_K
            out[k] = rows
        return out

    def next_token_stacks(self):
        return list(range(self.k - 1, -1, -1))  # horizon 1 runs through every stack, K first

    def horizon_rows(self, trunk_hidden, ctx_for, extra=None):
        # Horizon 1 sits at the end of the whole chain, so every stack runs; a skipped horizon saves its projection only.
        rows = self._chain(trunk_hidden, ctx_for, down_to=1)
        yield rows[1]  # [B, S, d]
        if extra is not None and self.cfg.trunk_grad == "detached":
            rows = self._chain(extra, ctx_for, down_to=2)  # horizons ≥ 2: their own chain from the detached trunk state
        for k in range(2, self.k + 1):
            yield rows[k]

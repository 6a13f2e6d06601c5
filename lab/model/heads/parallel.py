"""Parallel heads (Gloeckle et al.): K independent block stacks on the trunk state."""

from lab.model.heads.base import BlockStackHead


class ParallelHead(BlockStackHead):
    def forward(self, trunk_hidden, batch, ctx, shared, n_horizons=None):
        horizons = []
        for k, stack in enumerate(self.stacks[: self.horizons_to_run(n_horizons)], start=1):
            source = trunk_hidden if k == 1 else self.extra_horizon_input(trunk_hidden)  # [B, S, d]
            horizons.append(self.endpoint(k, stack(source, ctx), batch, shared))
        return horizons

    def horizon_rows(self, trunk_hidden, ctx_for):
        for i, stack in enumerate(self.stacks):
            yield stack(trunk_hidden, ctx_for(("stack", i)))  # [B, S, d]: horizon i + 1

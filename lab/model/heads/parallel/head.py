"""Parallel heads (Gloeckle et al.): K independent block stacks on the trunk state."""

import torch

from lab.model.heads.block_stack import BlockStackHead
from lab.model.heads.parallel.stacked import StackedBlocks


class ParallelHead(BlockStackHead):
    drafts_read_trunk_rows = True

    def horizon_rows(self, trunk_hidden, ctx_for, extra=None):
        for i, stack in enumerate(self.stacks):
            source = trunk_hidden if i == 0 or extra is None else extra  # [B, S, d]
            yield stack(source, ctx_for(("stack", i)))  # [B, S, d]: horizon i + 1

    def decode_drafter(self):
        """Stacks 2..K read the same trunk rows: one batched forward over a shared cache ("drafts") with a head axis.
        Native blocks (the HF model's own layers) run stack by stack, each on its own cache."""
        if self.k == 1:
            return super().decode_drafter()
        if self.stacks[1].native is not None:
            return lambda trunk_hidden, rest, ctx_for: torch.cat(
                [self.stacks[i](trunk_hidden, ctx_for(("stack", i))) for i in range(1, self.k)])  # [K-1, n, d]
        drafts = StackedBlocks([stack.blocks for stack in self.stacks[1:]])
        return lambda trunk_hidden, rest, ctx_for: drafts(trunk_hidden.expand(self.k - 1, -1, -1), ctx_for(("drafts",)))  # [K-1, n, d]

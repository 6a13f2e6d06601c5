"""The base class every head architecture derives from, and the pieces heads share.

A head never projects to the vocabulary: it hands the objective d-wide rows plus the
(norm, weight) pair to project them with, so the backward schedule decides when the
V-wide logits exist.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.nn as nn

from lab.horizon import Horizon, SharedParts, endpoint_horizon
from lab.decode_core.proposer import HeadDrafter
from lab.labels import horizon_mask
from lab.model.heads.config import HeadConfig
from lab.nn.blocks import AttentionContext, Block, ModelConfig
from lab.schema import field_names, typed


@dataclass(frozen=True)
class UnusedWhen:
    """`option` changes nothing while every field in `when` has its value (e.g. DeepSeek's `rollout_tokens` under
    `rollout=teacher`); lab/config/unused.py refuses or notes it, tests/test_unused_settings.py trains both ways."""

    option: str
    when: tuple[tuple[str, object], ...]  # (field, value) pairs of the head config
    why: str

    def holds(self, cfg: HeadConfig) -> bool:
        return all(getattr(cfg, field) == value for field, value in self.when)


@dataclass(frozen=True)
class NextTokenPath:
    """What horizon 1 needs from a head, for a next-token-only release (lab/release/export.py): `blocks`, the head
    state-key prefixes of the blocks horizon 1 runs after the trunk, in order (each becomes one more trunk block);
    `projection`, horizon 1's own V×d projection key (None: the trunk's); the release's head config; the keys kept."""

    blocks: tuple[str, ...] = ()
    projection: str | None = None
    release_head: Mapping = dataclasses.field(default_factory=lambda: {"name": "ntp", "k": 1})
    kept: tuple[str, ...] = ()


class MTPHead(nn.Module):
    """Base class: K horizons, optional replicated unembeddings, trunk-gradient ownership.

    What the module itself uses lives on its class: its config, its drafter, compute matching, which horizon
    each weight serves and the next-token path. What the rest of the harness reads (release layout names, report
    traits, test examples) is its folder's `HeadSpec` (lab/model/heads/spec.py).
    """

    config_class: type[HeadConfig] = HeadConfig
    # The modules FSDP shards and `model.compile` compiles one by one (the trunk's Block always is one).
    sharding_units: tuple[type[nn.Module], ...] = (Block,)
    # Head containers whose index i holds horizon i + offset (e.g. `projections.0` is horizon 1).
    horizon_containers: Mapping[str, int] = {"projections": 1}

    @classmethod
    def build_config(cls, values: Mapping) -> HeadConfig:
        """The typed, checked config from a mapping (fields left out take their defaults)."""
        common = field_names(HeadConfig)
        # An architecture's own option (any head's, this one's included) set to null means "not set": its default. The
        # `head` group's schema holds every registered head's options as null, and a sweep sets `head.depth: null` for every head.
        values = {key: value for key, value in values.items() if key in common or value is not None}
        cfg = typed(cls.config_class, values, "head", owner=f"head '{values.get('name')}'")
        cls.check_config(cfg)
        return cfg

    # Options every head has (HeadConfig) that this architecture has no use for: set away from their
    # default they would change nothing, so a new run that sets one is refused (a sweep job: noted;
    # lab/config/unused.py) rather than silently ignoring it. Checkpoints and manifests of earlier runs that set one still load.
    unused_options: tuple[str, ...] = ()
    # Options this architecture reads only under some values of its other options (UnusedWhen): refused or noted
    # the same way when those values hold.
    unused_when: tuple[UnusedWhen, ...] = ()

    @classmethod
    def check_config(cls, cfg: HeadConfig) -> None:
        """This architecture's checks of its options across fields (the fields themselves are checked when the
        config is constructed); `build_config` and `MTPModel` run them."""

    # The class decoding drafts with for this head (lab.decode_core.proposer.HeadDrafter): built once per
    # request as drafter(state, draft_steps[, tree]); its flags say whether it drafts trees and batches.
    # None: the head drafts nothing (speculative decoding needs a drafter).
    drafter: type[HeadDrafter] | None = None

    def __init__(self, cfg: HeadConfig, model_cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.k = cfg.k
        self.offsets = cfg.horizon_offsets
        self.projections = None
        if cfg.unembedding == "replicated":
            self.projections = nn.ParameterList(
                nn.Parameter(torch.randn(model_cfg.vocab_size, model_cfg.d_model) * model_cfg.init_std) for _ in range(cfg.k)
            )

    @staticmethod
    def main_path_blocks(cfg: HeadConfig) -> int:
        """Head blocks on the horizon-1 path (what `compute_match=next_token_path` takes from the trunk)."""
        return 0

    @staticmethod
    def head_blocks(cfg: HeadConfig) -> int:
        """Transformer blocks the head runs per token, all horizons together (`compute_match=blocks`)."""
        return 0

    def forward_flops(self, seq_len: int, model_cfg: ModelConfig) -> int:
        """Matmul FLOPs of the head's own layers for one sequence of `seq_len` tokens (no vocabulary projection)."""
        return 0

    def projection(self, k: int, shared: SharedParts) -> torch.Tensor:
        return shared.unembedding if self.projections is None else self.projections[k - 1]  # [V, d]

    def extra_horizon_input(self, trunk_hidden: torch.Tensor) -> torch.Tensor:
        """The trunk state that horizons ≥ 2 see: detached when the trunk must get no MTP gradient."""
        return trunk_hidden if self.cfg.trunk_grad in ("joint", "lora") else trunk_hidden.detach()

    def endpoint(self, k: int, rows: torch.Tensor, batch: dict, shared: SharedParts) -> Horizon:
        """Full-length rows [B, S, d] of horizon k under the endpoint rule at its offset."""
        return endpoint_horizon(k, rows, batch, shared.final_norm, self.projection(k, shared), self.offsets[k - 1])

    def validity_mask(self, k: int, batch: dict) -> torch.Tensor:
        """[B, S-o_k] the rows horizon k supervises, from the labels alone (for a horizon the step skips)."""
        return horizon_mask(batch["active"], batch["segment_ids"], self.offsets[k - 1], batch.get("target_mask"))

    def horizons_to_run(self, n_horizons: int | None) -> int:
        """Horizons 1..n a forward builds: all K, or the first n when the rest carry λ = 0 for good."""
        return self.k if n_horizons is None else max(1, min(self.k, n_horizons))

    @property
    def can_draft(self) -> bool:
        """Speculative decoding needs draft horizons at offsets 2, 3, … (a leap leaves slots undrafted)."""
        return self.drafter is not None and self.k > 1 and self.cfg.contiguous_offsets

    def head_stacks(self) -> list[nn.Module]:
        """Per-horizon block stacks (for init options); empty for heads without blocks."""
        return []

    # ---- decoding (lab.decode): rows of every position, no labels, no detaching ------
    def horizon_rows(self, trunk_hidden: torch.Tensor, ctx_for, extra: torch.Tensor | None = None) -> Iterator[torch.Tensor]:
        """The head's one computation: rows before the final norm for horizons 1, 2, … (all S positions), lazily.

        Training (`forward`) and decoding both read it. `ctx_for(key)` returns the attention context of the
        block stack named `key` (("stack", i) for `stacks[i]`): decoding gives each stack its own KV cache that
        way, training one context for all. `extra`: the trunk state horizons ≥ 2 start from in training
        (`extra_horizon_input`: detached when the trunk gets no MTP gradient); None in decoding (the trunk
        state itself). A caller that needs horizon 1 only stops after the first row set, so stacks of
        horizons ≥ 2 never run. The next-token baseline yields horizon 1 only.
        """
        yield trunk_hidden  # [B, S, d]

    def next_token_stacks(self) -> list[int]:
        """Indices into `stacks` that horizon 1 runs through (their caches are target state)."""
        return []

    # Identity heads: every draft horizon's logits at a row are that row's next-token logits.
    drafts_reuse_next_token_logits = False
    # The draft horizons read nothing but the trunk rows (parallel, linear): after a tree pass their
    # stacks can run on the accepted path's rows alone instead of on every node.
    drafts_read_trunk_rows = False

    def decode_drafter(self):
        """For decoding: f(trunk_hidden [1, n, d], rest, ctx_for) -> [G, n, d], the rows of draft horizons 2..K.

        `rest` is the `horizon_rows` iterator after horizon 1; G = K−1, or 1 when every draft
        horizon reads the same rows. This default runs the remaining horizons one by one;
        heads with independent draft weights override it with one batched forward.
        """
        return lambda trunk_hidden, rest, ctx_for: torch.stack([rows[0] for rows in rest])  # [K-1, n, d]

    def initialize(self, trunk: nn.Module) -> None:
        """Apply `init` and copy the trunk unembedding into replicated projections."""
        if self.projections is not None:
            with torch.no_grad():
                for projection in self.projections:
                    projection.copy_(trunk.unembedding)
        stacks = self.head_stacks()
        if self.cfg.init == "copy_last" and stacks:
            for stack in stacks:
                for block in stack.blocks:
                    block.load_state_dict(trunk.blocks[-1].state_dict())  # copies into the block's own Parameters
        elif self.cfg.init == "copy_first_head":
            for stack in stacks[1:]:
                stack.load_state_dict(copy.deepcopy(stacks[0].state_dict()))

    def horizon_of(self, name: str) -> int | str:
        """The horizon a head state key (relative to the head) serves; "all" for weights every horizon uses."""
        container, _, rest = name.partition(".")
        index = rest.split(".", 1)[0]
        if container not in self.horizon_containers or not index.isdigit():
            known = ", ".join(self.horizon_containers)
            raise ValueError(f"no horizon rule for head parameter '{name}' of {type(self).__name__} (known containers: {known})")
        return int(index) + self.horizon_containers[container]

    def next_token_path(self) -> NextTokenPath:
        """Horizon 1 is the trunk's own output projected by horizon 1's unembedding."""
        return NextTokenPath(projection=None if self.projections is None else "projections.0")

    def forward(self, trunk_hidden: torch.Tensor, batch: dict, ctx: AttentionContext, shared: SharedParts,
                n_horizons: int | None = None) -> list[Horizon]:
        """Horizons 1..n (`horizons_to_run(n_horizons)`), each a `Horizon`, from `horizon_rows` (zip stops before
        the rows of horizon n + 1 are computed)."""
        rows = self.horizon_rows(trunk_hidden, lambda key: ctx, self.extra_horizon_input(trunk_hidden))
        return [self.endpoint(k, r, batch, shared) for k, r in zip(range(1, self.horizons_to_run(n_horizons) + 1), rows)]

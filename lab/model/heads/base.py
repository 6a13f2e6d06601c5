"""What every head returns and the pieces heads share.

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

from lab.errors import ConfigError, require
from lab.schema import field_names, typed
from lab.inference.proposer import HeadDrafter
from lab.labels import horizon_mask
from lab.model.draft_vocab import check_draft_vocab
from lab.model.flops import block_forward_flops
from lab.model.heads.independent_drafter import IndependentHeads
from lab.model.native_layers import NativeLayers, layer_forward_flops
from lab.model.trunk import AttentionContext, Block, ModelConfig, RMSNorm

UNEMBEDDINGS = ("shared", "replicated")
# `head.compute_match`'s allowed values, each with the head blocks that take the place of trunk blocks
# (lab/model/mtp.py: trunk_layers; docs/heads.md). Null takes HeadConfig's default on the harness's GPT
# (lab.model.heads.head_config) and `none` on a pretrained trunk (lab/model/mtp.py: head_defaults_for).
COMPUTE_MATCH_REMOVES = {
    # the paper's: trunk blocks + every head block (DeepSeek depth blocks too) = model.n_layers
    "blocks": lambda head, cfg: head.head_blocks(cfg),
    # only the horizon-1 path (trunk + its head blocks) keeps model.n_layers
    "next_token_path": lambda head, cfg: head.main_path_blocks(cfg),
    # the heads are added on top of an unchanged trunk
    "none": lambda head, cfg: 0,
}
# copy_last: every head block starts as a copy of the last trunk block (Medusa-2 / FastMTP)
INITS = ("random", "copy_last", "copy_first_head")
INIT_ALIASES = {"copy_last_block": "copy_last"}  # the option's earlier name (manifests of older runs)
# lab: the harness's Block; native: the HF model's own decoder layer (model=hf; lab/model/native_layers.py)
BLOCKS = ("lab", "native")
# detached: horizons ≥ 2 send the trunk no gradient; frozen: trunk, embedding, final norm and
# unembedding get no gradient at all and no optimizer state (heads trained on a fixed model);
# lora: a pretrained trunk (model=hf) stays fixed except its LoRA adapters (head.lora), which every horizon trains.
TRUNK_GRADS = ("joint", "detached", "frozen", "lora")


@dataclass
class HeadConfig:
    """Options every head has. A head with options of its own subclasses this (see DeepSeekConfig)
    and names the subclass in its `config_class`; `MTPHead.build_config` fills and checks it."""

    name: str = "ntp"
    k: int | None = 1
    n_layers: int = 1  # transformer blocks per head (block heads)
    compute_match: str = "blocks"  # COMPUTE_MATCH_REMOVES; `none` on a pretrained trunk
    unembedding: str = "shared"
    init: str = "random"
    block: str = "lab"  # what head blocks (block stacks, DeepSeek depth modules) are made of
    trunk_grad: str = "joint"
    offsets: list[int] | None = None  # horizon k predicts tokens[t + offsets[k-1]]; None: [1..K]
    lora: dict | None = None  # trunk_grad=lora: r, alpha, dropout, target_modules (lab/model/lora.py)
    draft_vocab: int | None = None  # horizons ≥ 2 predict over the N most frequent training tokens (lab/model/draft_vocab.py)

    def __post_init__(self) -> None:
        """The fields' checks run here, so a config built in Python (`HeadConfig(...)`, `MTPModel(...)` in a
        benchmark) is refused with the same line as one from the command line; the architecture's own checks
        (`MTPHead.check_config`) run when the config is typed (`build_config`) and when a model is built."""
        require(isinstance(self.k, int) and self.k >= 1, "head.k", f"must be an integer ≥ 1, got {self.k}")
        require(self.n_layers >= 1, "head.n_layers", f"must be ≥ 1, got {self.n_layers}")
        self.init = INIT_ALIASES.get(self.init, self.init)
        for name, value, allowed in (
            ("head.unembedding", self.unembedding, UNEMBEDDINGS),
            ("head.init", self.init, INITS),
            ("head.block", self.block, BLOCKS),
            ("head.trunk_grad", self.trunk_grad, TRUNK_GRADS),
            ("head.compute_match", self.compute_match, tuple(COMPUTE_MATCH_REMOVES)),
        ):
            if value not in allowed:
                raise ConfigError(name, f"unknown '{value}'; allowed: {', '.join(allowed)}")
        if self.offsets is not None:
            require(isinstance(self.offsets, (list, tuple)), "head.offsets", f"must be a list of integers or null, got {self.offsets!r}")
            check_offsets(list(self.offsets), self.k)
        check_draft_vocab(self.draft_vocab)  # K = 1: lab/config/unused.py (a sweep job notes it), MTPModel refuses it
        if self.trunk_grad == "lora":
            from lab.model.lora import lora_settings

            lora_settings(self.lora)

    @property
    def horizon_offsets(self) -> tuple[int, ...]:
        """The offset each horizon predicts at: `offsets`, or 1..K."""
        return tuple(self.offsets) if self.offsets is not None else tuple(range(1, self.k + 1))

    @property
    def contiguous_offsets(self) -> bool:
        return self.horizon_offsets == tuple(range(1, self.k + 1))


def check_offsets(offsets: list, k: int) -> None:
    """Leap offsets: K integers, the first 1 (horizon 1 is the next token), strictly increasing."""
    shown = f"got {offsets}"
    require(all(isinstance(o, int) and not isinstance(o, bool) for o in offsets), "head.offsets", f"must be a list of integers, {shown}")
    require(len(offsets) == k, "head.offsets", f"must have K = {k} entries (one per horizon), {shown}")
    require(offsets[0] == 1, "head.offsets", f"must start at 1 (horizon 1 is the next token), {shown}")
    require(all(a < b for a, b in zip(offsets, offsets[1:])), "head.offsets", f"must be strictly increasing, {shown}")


@dataclass
class Teacher:
    """Self-distillation target of one horizon: the next-token path's rows that predict the same tokens."""

    rows: torch.Tensor  # [B, S-o, d] detached horizon-1 rows t+o-1 (before the final norm)
    norm_weight: torch.Tensor  # [d] detached final-norm weight of horizon 1
    norm: RMSNorm  # the final norm (its `normalize` takes the detached weight)
    weight: torch.Tensor  # [V, d] detached horizon-1 projection
    ce_weight: float  # the data label's share of the per-row loss
    divergence: str  # the divergence from the teacher's distribution (lab/objective/targets.py: DIVERGENCES)
    divergence_weight: float  # its share
    eta: float = 3.0  # lk_hybrid's λ = exp(−η·α)


@dataclass
class KnownRows:
    """A horizon's per-row loss and top-1 hit, known before the step (`MTPModel.with_known_next_token`).

    Horizon 1 of a head that keeps the trunk's own next-token path scores the same at every step while the
    trunk is frozen, so the hidden-state cache stores it once and the backward schedule sums it under the
    horizon's mask instead of building its V-wide logits (lab/objective/backward.py: `known_stats`).
    """

    row_loss: torch.Tensor  # [B, S-k] the cross-entropy of every row, in the loss dtype
    row_hit: torch.Tensor  # [B, S-k] bool: the label was the top-1 logit


@dataclass
class Horizon:
    """One horizon's supervision, aligned to source rows t = 0 .. S-k-1."""

    k: int
    hidden: torch.Tensor  # [B, S-k, d] rows before the final norm
    labels: torch.Tensor  # [B, S-k] long: tokens[t+k]
    mask: torch.Tensor  # [B, S-k] bool: which rows are supervised
    norm: RMSNorm  # final norm applied before the projection
    weight: torch.Tensor  # [V, d] projection to the vocabulary
    offset: int | None = None  # the token distance predicted (tokens[t+offset]); None: k
    teacher: Teacher | None = None  # set by the objective for distilled targets (training only)
    vocab_ids: torch.Tensor | None = None  # [N] the draft vocabulary `weight` and `labels` index (head.draft_vocab); None: all V
    draft_coverage: torch.Tensor | None = None  # [2] (supervised targets inside the draft vocabulary, all supervised targets)
    known: KnownRows | None = None  # the rows' loss and hits when no step can change them (no logits are built)

    def __post_init__(self) -> None:
        if self.offset is None:
            self.offset = self.k


@dataclass
class SharedParts:
    """Trunk-owned modules a head may use; passed at call time so they are never copied."""

    embed: nn.Embedding
    final_norm: RMSNorm
    unembedding: nn.Parameter  # [V, d]
    draft_ids: torch.Tensor | None = None  # [N] the draft vocabulary (head.draft_vocab) horizons ≥ 2 choose from; None: all V


def endpoint_horizon(k: int, rows: torch.Tensor, batch: dict, norm: RMSNorm, weight: torch.Tensor, offset: int | None = None) -> Horizon:
    """Package full-length rows [B, S, d] as horizon k predicting tokens[t + offset] (default offset k), endpoint rule."""
    offset = k if offset is None else offset
    seq_len = rows.shape[1]
    return Horizon(
        k=k,
        hidden=rows[:, : seq_len - offset],  # [B, S-o, d]: source rows that have a target
        labels=batch["tokens"][:, offset:],  # [B, S-o]: tokens[t+o]
        mask=horizon_mask(batch["active"], batch["segment_ids"], offset, batch.get("target_mask")),  # [B, S-o]
        norm=norm,
        weight=weight,
        offset=offset,
    )


def native_layers(cfg: HeadConfig, model_cfg: ModelConfig) -> NativeLayers | None:
    """The HF trunk's layer builder when `head.block=native` (its cfg carries one), else None: harness blocks."""
    if cfg.block != "native":
        return None
    native = getattr(model_cfg, "native", None)
    require(native is not None, "head.block", "native builds the Hugging Face model's own decoder layer: it needs model=hf; allowed here: lab")
    return native


def head_block_flops(block: nn.Module, model_cfg: ModelConfig, rows: int) -> int:
    """Forward matmul FLOPs of one head block (a harness Block or a native decoder layer) on `rows` rows."""
    return block_forward_flops(model_cfg, rows) if isinstance(block, Block) else layer_forward_flops([block], rows, model_cfg.d_model)


class BlockStack(nn.Module):
    """`n` transformer blocks applied in sequence: one head of a block architecture. With `native`, the
    blocks are the HF model's decoder layers numbered from `first_index` among the head's layers."""

    def __init__(self, model_cfg: ModelConfig, n: int, native: NativeLayers | None = None, first_index: int = 0):
        super().__init__()
        self.native = native
        self.blocks = nn.ModuleList(Block(model_cfg) if native is None else native.build(first_index + i) for i in range(n))

    def forward(self, x: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        if self.native is not None:
            return self.native.run(self.blocks, x, ctx)  # [B, S, d]
        for block in self.blocks:
            x = block(x, ctx)
        return x


@dataclass(frozen=True)
class NextTokenPath:
    """What horizon 1 needs from a head, for a next-token-only release (lab/checkpoint/export.py).

    `blocks`: head state-key prefixes of the transformer blocks horizon 1 runs right after
    the trunk, in order (each becomes one more trunk block of the release).
    `projection`: the head state key of horizon 1's own V×d projection (None: the trunk's).
    `release_head`: the head config of the release; `kept`: head state keys it keeps as they are.
    """

    blocks: tuple[str, ...] = ()
    projection: str | None = None
    release_head: Mapping = dataclasses.field(default_factory=lambda: {"name": "ntp", "k": 1})
    kept: tuple[str, ...] = ()


class MTPHead(nn.Module):
    """Base class: K horizons, optional replicated unembeddings, trunk-gradient ownership.

    What the module itself uses lives on its class: its config (`config_class`, `build_config`),
    its drafter, compute matching (`main_path_blocks`), which horizon each weight serves
    (`horizon_of`) and the next-token path (`next_token_path`). What the rest of the harness reads
    (release layouts, report traits, test examples) is its folder's `HeadSpec` (lab/model/heads/spec.py).
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

    @classmethod
    def check_config(cls, cfg: HeadConfig) -> None:
        """This architecture's checks of its options across fields (the fields themselves are checked when the
        config is constructed); `build_config` and `MTPModel` run them."""

    # The class decoding drafts with for this head (lab.inference.proposer.HeadDrafter): built once per
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
    def horizon_rows(self, trunk_hidden: torch.Tensor, ctx_for) -> Iterator[torch.Tensor]:
        """Rows before the final norm for horizons 1, 2, … (all S positions), produced lazily.

        `ctx_for(key)` returns the attention context of the block stack named `key`
        (("stack", i) for `stacks[i]`); decoding gives each stack its own KV cache that
        way. A caller that needs horizon 1 only stops after the first row set, so block
        stacks of horizons ≥ 2 never run. Heads without independent drafts yield horizon 1 only.
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
        """Horizons 1..n (`horizons_to_run(n_horizons)`), each a `Horizon`."""
        raise NotImplementedError


class BlockStackHead(MTPHead):
    """Heads made of K block stacks (parallel, causal, anticausal); they differ only in wiring."""

    horizon_containers = {**MTPHead.horizon_containers, "stacks": 1}
    drafter = IndependentHeads

    def __init__(self, cfg: HeadConfig, model_cfg: ModelConfig):
        super().__init__(cfg, model_cfg)
        native = native_layers(cfg, model_cfg)
        self.stacks = nn.ModuleList(BlockStack(model_cfg, cfg.n_layers, native, i * cfg.n_layers) for i in range(cfg.k))

    @staticmethod
    def main_path_blocks(cfg: HeadConfig) -> int:
        return cfg.n_layers

    @staticmethod
    def head_blocks(cfg: HeadConfig) -> int:
        return cfg.k * cfg.n_layers

    def forward_flops(self, seq_len: int, model_cfg: ModelConfig) -> int:
        return (self.head_blocks(self.cfg) + self.recomputed_blocks()) * head_block_flops(self.stacks[0].blocks[0], model_cfg, seq_len)

    def recomputed_blocks(self) -> int:
        """Blocks run a second time on a detached trunk state (`trunk_grad=detached`); 0 by default."""
        return 0

    def head_stacks(self) -> list[nn.Module]:
        return list(self.stacks)

    def next_token_stacks(self) -> list[int]:
        """Indices of the stacks horizon 1 runs after the trunk, in order (stack 0: horizon 1's own)."""
        return [0]

    def next_token_path(self) -> NextTokenPath:
        blocks = tuple(f"stacks.{i}.blocks.{b}" for i in self.next_token_stacks() for b in range(len(self.stacks[i].blocks)))
        return dataclasses.replace(super().next_token_path(), blocks=blocks)


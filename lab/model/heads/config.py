"""The options every head has (`HeadConfig`) and their allowed values, stated once."""

from __future__ import annotations

from dataclasses import dataclass

from lab.errors import ConfigError, is_int, require, require_int
from lab.nn.draft_vocab import check_draft_vocab

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
# lab: the harness's Block; native: the HF model's own decoder layer (model=hf; lab/nn/native_layers.py)
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
    lora: dict | None = None  # trunk_grad=lora: r, alpha, dropout, target_modules (lab/nn/lora.py)
    draft_vocab: int | None = None  # horizons ≥ 2 predict over the N most frequent training tokens (lab/nn/draft_vocab.py)

    def __post_init__(self) -> None:
        """The fields' checks run here, so a config built in Python (`HeadConfig(...)`, `MTPModel(...)` in a
        benchmark) is refused with the same line as one from the command line; the architecture's own checks
        (`MTPHead.check_config`) run when the config is typed (`build_config`) and when a model is built."""
        require_int(self.k, "head.k", least=1)
        require_int(self.n_layers, "head.n_layers", least=1)
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
            from lab.nn.lora import lora_settings

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
    require(all(is_int(o) for o in offsets), "head.offsets", f"must be a list of integers, {shown}")
    require(len(offsets) == k, "head.offsets", f"must have K = {k} entries (one per horizon), {shown}")
    require(offsets[0] == 1, "head.offsets", f"must start at 1 (horizon 1 is the next token), {shown}")
    require(all(a < b for a, b in zip(offsets, offsets[1:])), "head.offsets", f"must be strictly increasing, {shown}")

"""Mixture-of-experts routers of a `model=hf` network: where they are, what they chose, how loaded the experts were.

A router is found by its class (`ROUTER_AFFINITY`, a registry: one line per family) anywhere in the trunk's
decoder layers (place `l{i}`, trunk layer i) or in the head (place `h{k}`, the head block serving horizon k:
DeepSeek depth d is `h{d+1}`; a head with several MoE layers on one horizon numbers them `h{k}_b{j}`).

`RouterTap` records, while it is entered, every call of those routers: the router logits and the experts
it chose for each row. Nothing is hooked outside a `with RouterTap(...)` block, so a run that measures
nothing pays nothing. Which of the recorded rows count (real tokens, not padding; for a depth module the rows
that have a state) is decided by `valid_rows` from the batch.

The checks of expert counts (`check_expert_counts`) run on the config alone, before any weight exists;
`model.router` (`RouterConfig`: DeepSeek-V3's balancing tools, lab/training/router_balance.py) is checked
against the built model's routers (`check_router_options`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from lab.errors import require
from lab.labels import chain_masks
from lab.schema import typed

# Router class -> how it turns its logits into the affinities s_{i,t} it ranks (DeepSeek-V3 and GLM-4.5: a
# sigmoid per expert; Qwen3-MoE and Mixtral: a softmax over experts). All four return
# (router_logits [N, E], top-k weights [N, k], top-k expert ids [N, k]) from a per-token top-k: no capacity,
# nothing dropped, so a token's route never depends on the other tokens of the batch.
ROUTER_AFFINITY = {
    "DeepseekV3TopkRouter": "sigmoid",
    "Glm4MoeTopkRouter": "sigmoid",
    "Qwen3MoeTopKRouter": "softmax",
    "MixtralTopKRouter": "softmax",
}
AFFINITIES = {"sigmoid": torch.sigmoid, "softmax": lambda logits: logits.softmax(-1)}
# Config keys that hold the routed-expert count, per family naming (the first one present is the family's).
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
TOP_K_KEY = "num_experts_per_tok"


def check_expert_counts(config, where: str) -> None:
    """An MoE config's expert count ≥ 1 and 1 ≤ top-k ≤ experts, one line naming the key (`where` = model.config…)."""
    key = next((name for name in EXPERT_COUNT_KEYS if isinstance(getattr(config, name, None), int)), None)
    if key is None:
        return  # a dense family
    experts = getattr(config, key)
    require(experts >= 1, f"{where}.{key}", f"must be ≥ 1 (routed experts), got {experts}")
    top_k = getattr(config, TOP_K_KEY, None)
    if isinstance(top_k, int):
        require(1 <= top_k <= experts, f"{where}.{TOP_K_KEY}",
                f"each token picks top-k of the {experts} experts ({where}.{key}); allowed: 1..{experts}, got {top_k}")


@dataclass
class RouterPlace:
    """One router: its metric place (`l1`, `h2`, …), the module, expert count, top-k and affinity."""

    place: str
    module: nn.Module = field(repr=False)
    n_experts: int
    top_k: int
    affinity: str

    @property
    def trainable(self) -> bool:
        return self.module.weight.requires_grad

    @property
    def has_selection_bias(self) -> bool:
        return isinstance(getattr(self.module, "e_score_correction_bias", None), torch.Tensor)


def is_router(module: nn.Module) -> bool:
    return type(module).__name__ in ROUTER_AFFINITY


def place_of(module: nn.Module, place: str) -> RouterPlace:
    return RouterPlace(place, module, int(module.num_experts), int(module.top_k), ROUTER_AFFINITY[type(module).__name__])


def router_places(model: nn.Module) -> list[RouterPlace]:
    """Every router of an MTPModel, trunk layers first, then head blocks by horizon ([] on a dense model)."""
    places = [place_of(m, f"l{i}") for i, block in enumerate(model.trunk.blocks) for m in block.modules() if is_router(m)]
    by_horizon: dict[str, list[nn.Module]] = {}
    for name, module in model.head.named_modules():
        if is_router(module):
            by_horizon.setdefault(f"h{model.head.horizon_of(name)}", []).append(module)
    for horizon, routers in by_horizon.items():
        names = [horizon] if len(routers) == 1 else [f"{horizon}_b{j}" for j in range(len(routers))]
        places += [place_of(m, name) for m, name in zip(routers, names)]
    return places


@dataclass
class Routing:
    """One router call: logits [N, E] (with their graph when the tap keeps it) and chosen expert ids [N, k]."""

    place: RouterPlace
    logits: torch.Tensor
    chosen: torch.Tensor

    def affinity(self) -> torch.Tensor:
        return AFFINITIES[self.place.affinity](self.logits.float())  # [N, E]


class RouterTap:
    """Forward hooks on `places` while entered; `records` holds one Routing per router call, in call order.

    `keep_graph=False` detaches the logits (statistics); True keeps them for a loss on the routing."""

    def __init__(self, places: list[RouterPlace], keep_graph: bool = False):
        self.places, self.keep_graph = places, keep_graph
        self.records: list[Routing] = []
        self._handles: list = []

    def __enter__(self) -> "RouterTap":
        self.records = []
        for place in self.places:
            self._handles.append(place.module.register_forward_hook(self._hook(place)))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, place: RouterPlace):
        def record(module, args, output):
            logits, chosen = output[0], output[-1]  # [N, E], [N, k]
            self.records.append(Routing(place, logits if self.keep_graph else logits.detach(), chosen.detach()))

        return record


def valid_rows(batch: dict, n_rows: int) -> torch.Tensor:
    """[N] bool: which of the N = B·S' rows a router saw count. S' = S: the trunk's (or a head stack's) rows, real
    tokens only; S' = S − d: DeepSeek depth d's rows, those whose window t..t+d has a state (its chain mask)."""
    active = batch["active"]  # [B, S]
    rows = n_rows // active.shape[0]
    depth = active.shape[1] - rows
    if depth == 0:
        return active.reshape(-1)  # [B·S]
    return chain_masks(active, batch["segment_ids"], depth)[0].reshape(-1)  # [B, S-d] -> [B·(S-d)]


def tokens_per_expert(routing: Routing, valid: torch.Tensor) -> torch.Tensor:
    """[E] float64: how many valid rows chose each expert (a row counts once for each of its k experts)."""
    chosen = routing.chosen[valid]  # [n, k]
    return torch.bincount(chosen.reshape(-1), minlength=routing.place.n_experts).to(torch.float64)  # [E]


def load_statistics(load: torch.Tensor, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """From tokens per expert [E] and the routed tokens []: max/mean load, coefficient of variation (population
    std / mean) and the share of tokens the most loaded expert took (max load / tokens, in [k/E, 1])."""
    mean = load.mean()
    return {
        "max_mean": load.max() / mean.clamp_min(1e-12),
        "cv": load.std(correction=0) / mean.clamp_min(1e-12),
        "top_share": load.max() / tokens.clamp_min(1),
    }


@dataclass
class RouterConfig:
    """`model.router`: both off (0) by default."""

    bias_update_rate: float = 0.0  # γ of the auxiliary-loss-free bias update (DeepSeek-V3: 0.001)
    balance_loss_alpha: float = 0.0  # α of the sequence-wise balance loss (DeepSeek-V3: 0.0001)

    def __post_init__(self):
        for name in ("bias_update_rate", "balance_loss_alpha"):
            value = getattr(self, name)
            require(isinstance(value, (int, float)) and value >= 0, f"model.router.{name}", f"must be a number ≥ 0 (0 = off), got {value}")

    @property
    def enabled(self) -> bool:
        return self.bias_update_rate > 0 or self.balance_loss_alpha > 0


def router_config(values: RouterConfig | dict | None) -> RouterConfig:
    """`model.router` typed and checked (null: both tools off); an already typed one is returned as it is."""
    if isinstance(values, RouterConfig):
        return values
    return typed(RouterConfig, dict(values or {}), "model.router", owner="model.router")


def check_router_options(cfg: RouterConfig, places: list[RouterPlace], model_type: str) -> None:
    """A router option needs routed experts that train; the bias update a router with a selection bias."""
    if not cfg.enabled:
        return
    option = "model.router.bias_update_rate" if cfg.bias_update_rate > 0 else "model.router.balance_loss_alpha"
    require(places, option, f"'{model_type}' has no routed experts (a dense model): router options need an MoE model; "
                            "leave model.router at its defaults")
    require(any(place.trainable for place in places), option, "every router is frozen (head.trunk_grad=frozen or lora, no MoE head "
                                                              "blocks): nothing to balance")
    if cfg.bias_update_rate > 0:
        missing = sorted({type(place.module).__name__ for place in places if not place.has_selection_bias})
        require(not missing, "model.router.bias_update_rate",
                f"{', '.join(missing)} has no selection bias (e_score_correction_bias); the bias update needs a DeepSeek-V3-style "
                "router (deepseek_v3, glm4_moe)")

"""DeepSeek-V3's two expert-balancing tools, as options of `model.router` (model=hf with routed experts).

Auxiliary-loss-free balancing (`bias_update_rate` = γ): each router keeps a per-expert bias b_i that is added
to the affinities when the top-k experts are *selected* only (the gating weights stay the raw affinities).
transformers' DeepSeek-V3 and GLM-4.5 routers already hold it (`e_score_correction_bias`, a buffer: the
optimizer never sees it). After every optimizer step, with load_i the rows of this step (all ranks) that chose
expert i:

    b_i ← b_i + γ · sign(mean_j load_j − load_i)      (overloaded: −γ, underloaded: +γ, exactly average: 0)

Sequence-wise balance loss (`balance_loss_alpha` = α), per sequence of T rows and summed over the MoE layers:

    L = α Σ_i f_i P_i,  f_i = E / (k T) · #{t : expert i chosen at t},  P_i = (1/T) Σ_t s'_{i,t},
    s'_{i,t} = s_{i,t} / Σ_j s_{j,t}   (s: the router's affinities; a softmax router's already sum to 1)

A sequence is a packed row (the training sequence, as in the paper); padding rows are not counted, and a
DeepSeek depth's rows are those with a state. The loss is the mean over the rows of the batch that hold a
token; "chosen" is the experts the router actually selected (with the bias when it is on: the load the
experts really took). Only routers whose weights train are balanced (a frozen trunk's routing stays as it is).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from lab.nn.moe import RouterConfig, RouterPlace, RouterTap, router_places, tokens_per_expert, valid_rows
from lab.objective.distributed import all_reduce_sum


def updated_bias(bias: torch.Tensor, load: torch.Tensor, rate: float) -> torch.Tensor:
    """[E] b + γ · sign(mean load − load): the bias after one step whose rows loaded the experts `load` [E]."""
    return bias + rate * torch.sign(load.mean() - load).to(bias.dtype)


def sequence_balance_loss(affinity: torch.Tensor, chosen: torch.Tensor, valid: torch.Tensor, top_k: int) -> torch.Tensor:
    """[] mean over sequences with a token of Σ_i f_i P_i (without α).

    affinity [B, S, E] the router's s_{i,t}; chosen [B, S, k] the expert ids selected; valid [B, S] rows that count."""
    n_experts = affinity.shape[-1]
    weight = valid.to(affinity.dtype)  # [B, S]
    tokens = weight.sum(1)  # [B] T per sequence
    normalized = affinity / affinity.sum(-1, keepdim=True)  # [B, S, E] s'
    hits = F.one_hot(chosen, n_experts).sum(-2).to(affinity.dtype) * weight[..., None]  # [B, S, E]
    f = n_experts / (top_k * tokens.clamp_min(1))[:, None] * hits.sum(1)  # [B, E]
    p = (normalized * weight[..., None]).sum(1) / tokens.clamp_min(1)[:, None]  # [B, E]
    per_sequence = (f * p).sum(-1)  # [B]
    present = tokens > 0
    return per_sequence[present].sum() / present.sum().clamp_min(1)


class RouterBalance:
    """The step's side of `model.router`: records the trainable routers during the forward (`recording`), adds
    α·L to the step's loss (`loss`) and moves the biases after the optimizer step (`update_bias`)."""

    def __init__(self, cfg: RouterConfig, places: list[RouterPlace]):
        self.cfg = cfg
        self.places = [place for place in places if place.trainable]
        self.tap = RouterTap(self.places, keep_graph=cfg.balance_loss_alpha > 0)

    def recording(self):
        return self.tap if self.places else contextlib.nullcontext()

    def loss(self, batch: dict) -> torch.Tensor | None:
        """[] α Σ_layers L of this step's forward, or None when the loss is off."""
        if self.cfg.balance_loss_alpha == 0 or not self.tap.records:
            return None
        batch_size = batch["active"].shape[0]
        total = 0.0
        for routing in self.tap.records:
            rows = routing.logits.shape[0] // batch_size
            valid = valid_rows(batch, routing.logits.shape[0]).view(batch_size, rows)  # [B, S']
            affinity = routing.affinity().view(batch_size, rows, -1)  # [B, S', E]
            chosen = routing.chosen.view(batch_size, rows, -1)  # [B, S', k]
            total = total + sequence_balance_loss(affinity, chosen, valid, routing.place.top_k)
        return self.cfg.balance_loss_alpha * total

    @torch.no_grad()
    def update_bias(self, batch: dict) -> None:
        """b ← b + γ sign(mean load − load) per router, from the loads of this step's rows over all ranks."""
        if self.cfg.bias_update_rate > 0:
            loads: dict[int, torch.Tensor] = {}
            for routing in self.tap.records:
                key = id(routing.place.module)
                load = tokens_per_expert(routing, valid_rows(batch, routing.chosen.shape[0]))
                loads[key] = loads.get(key, 0) + load  # a module reused at several depths sums its calls
            for place in self.places:
                if id(place.module) in loads:
                    bias = place.module.e_score_correction_bias
                    bias.copy_(updated_bias(bias, all_reduce_sum(loads.pop(id(place.module))), self.cfg.bias_update_rate))
        self.tap.records = []


def build_router_balance(model) -> RouterBalance | None:
    """The step's RouterBalance for an MTPModel whose `model.router` turns a tool on (checked when the model was built)."""
    cfg = getattr(model.model_cfg, "router", None) or RouterConfig()  # the harness's GPT has no routers
    return RouterBalance(cfg, router_places(model)) if cfg.enabled else None

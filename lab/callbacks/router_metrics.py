"""Expert load per MoE layer and per MTP depth (model=hf with routed experts).

For every router (lab/nn/moe.py: place `l{i}` = trunk layer i, `h{k}` = the head block serving horizon k,
DeepSeek depth d is `h{d+1}`), over the rows that count (real tokens; a depth's rows with a state):

    {stage}/router/tokens/{place}/e{j}   rows that chose expert j (a row counts once per chosen expert)
    {stage}/router/max_mean/{place}      max load / mean load (1 = perfectly even)
    {stage}/router/cv/{place}            coefficient of variation of the load (population std / mean)
    {stage}/router/top_share/{place}     share of the rows routed to the most loaded expert (k/E when even, 1 at worst)
    train/router/balance_loss            α·Σ f_i P_i the step added (model.router.balance_loss_alpha > 0)

`train/` is one training step (the logging steps only), `val/` a whole validation pass. Router hooks exist only
around the batches measured (none on a dense model, none on steps that log nothing). Under DDP the loads are
summed over ranks.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from lab.nn.moe import RouterTap, load_statistics, router_places, tokens_per_expert, valid_rows
from lab.training.cadence import logs_this_step
from lab.training.step import step_outputs


def place_loads(records, batch: dict) -> dict[str, torch.Tensor]:
    """{place: [E] float64 tokens per expert} over the recorded calls (a module reused at several depths sums them)."""
    loads: dict[str, torch.Tensor] = {}
    for routing in records:
        load = tokens_per_expert(routing, valid_rows(batch, routing.chosen.shape[0]))
        loads[routing.place.place] = loads.get(routing.place.place, 0) + load
    return loads


def router_metrics(stage: str, loads: dict[str, torch.Tensor], top_k: dict[str, int]) -> dict[str, torch.Tensor]:
    """The metrics above from {place: tokens per expert}; `top_k` per place turns slots into rows."""
    metrics = {}
    for place, load in loads.items():
        for j, count in enumerate(load):
            metrics[f"{stage}/router/tokens/{place}/e{j}"] = count
        for name, value in load_statistics(load, load.sum() / top_k[place]).items():
            metrics[f"{stage}/router/{name}/{place}"] = value
    return metrics


class RouterMetrics(pl.Callback):
    def __init__(self, log_every_n_steps: int = 1):
        self.log_every_n_steps = log_every_n_steps  # further thinning: only steps with global_step % n == 0
        self.places = []
        self._tap: RouterTap | None = None
        self._val: dict[str, torch.Tensor] = {}

    def setup(self, trainer, pl_module, stage=None):
        self.places = router_places(pl_module.model)  # [] on a dense trunk and heads
        self._top_k = {place.place: place.top_k for place in self.places}

    def _open(self) -> None:
        self._tap = RouterTap(self.places).__enter__()

    def _close(self, batch: dict) -> dict[str, torch.Tensor]:
        tap, self._tap = self._tap, None
        tap.__exit__(None, None, None)
        return place_loads(tap.records, batch)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.places and logs_this_step(trainer) and trainer.global_step % self.log_every_n_steps == 0:
            self._open()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = step_outputs(outputs)
        metrics = {}
        if step is not None and step.router_loss is not None and logs_this_step(trainer):
            metrics["train/router/balance_loss"] = step.router_loss
        if self._tap is not None:
            loads = {place: pl_module.all_reduce_sum(load) for place, load in self._close(batch).items()}
            metrics.update(router_metrics("train", loads, self._top_k))
        if metrics:
            pl_module.log_dict({name: value.float() for name, value in metrics.items()}, on_step=True, on_epoch=False, batch_size=1)

    def on_validation_epoch_start(self, trainer, pl_module):
        self._val = {}

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.places:
            self._open()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self._tap is not None:
            for place, load in self._close(batch).items():
                self._val[place] = self._val.get(place, 0) + load

    def on_validation_epoch_end(self, trainer, pl_module):
        if not self._val or trainer.sanity_checking:
            return
        loads = {place: pl_module.all_reduce_sum(load) for place, load in self._val.items()}
        metrics = router_metrics("val", loads, self._top_k)
        pl_module.log_dict({name: value.float() for name, value in metrics.items()}, on_epoch=True, sync_dist=False, batch_size=1)

"""Draft agreement in validation: how often horizon k's top-1 equals the next-token path's.

Horizon k at row t predicts token t+k (t+o_k with leap offsets); so does the next-token path at row t+k−1
(t+o_k−1). If they
agree, a greedy self-speculative decoder would accept that draft (given the path up to
it). From the argmaxes the validation step already computed (no cache, no extra projection):

    val/agree/h{k}        P(argmax_k[t] == argmax_1[t+k-1])
    val/agree_chain/h{k}  the same, given agreement at horizons 2..k-1 at row t
    val/est_tokens_per_forward = 1 + Σ_{k≥2} Π_{j=2..k} agree_chain/h{j}
    val/top_token/h{k}    the id horizon k predicts most often (its argmax mode over supervised rows)
    val/top_token_share/h{k}  the share of those rows where it predicts that id

The last two tell a degenerate model apart: when every horizon predicts one frequent token, agreement is
near 1 without any drafting skill (the report warns).

A DeepSeek depth's argmax is teacher-forced (it saw the true tokens up to t+k−1, where a
decoder feeds its drafts), so its agreement estimates from above. The live decoding
callback measures the runtime figure next to it.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch

from lab.callbacks.horizon_metrics import ratio


def agreement_counts(row_argmax: list[torch.Tensor], offsets=None) -> dict[str, torch.Tensor]:
    """Per horizon k = 1..K: rows compared, rows agreeing, chain rows (2..k-1 agree), chain rows agreeing at k.

    row_argmax[k-1]: [B, S-o_k] top-1 ids of horizon k, -1 where the row is not supervised; offsets o_k default to k.
    """
    offsets = range(1, len(row_argmax) + 1) if offsets is None else offsets
    first = row_argmax[0]  # [B, S-1]
    agree_grids, valid_grids = [], []
    for choice, o in zip(row_argmax, offsets):
        rows = choice.shape[1]  # S-o
        reference = first[:, o - 1 : o - 1 + rows]  # [B, S-o]: the next-token path at row t+o-1 (predicts t+o)
        valid = (choice >= 0) & (reference >= 0)  # [B, S-k]
        agree_grids.append(valid & (choice == reference))
        valid_grids.append(valid)
    compared, agreed, chain_rows, chain_agreed = [], [], [], []
    for k in range(1, len(row_argmax) + 1):
        rows = valid_grids[k - 1].shape[1]  # S-k
        valid = torch.stack([v[:, :rows] for v in valid_grids[:k]]).all(0)  # [B, S-k]: horizons 1..k comparable at t
        prefix = torch.stack([a[:, :rows] for a in agree_grids[: k - 1]]).all(0) if k > 1 else torch.ones_like(valid)  # [B, S-k]
        compared.append(valid_grids[k - 1].sum()), agreed.append(agree_grids[k - 1].sum())
        chain_rows.append((valid & prefix).sum()), chain_agreed.append((valid & prefix & agree_grids[k - 1]).sum())
    stack = lambda values: torch.stack(values).double()  # noqa: E731
    return {"compared": stack(compared), "agreed": stack(agreed), "chain_rows": stack(chain_rows), "chain_agreed": stack(chain_agreed)}


def agreement_metrics(totals: dict[str, torch.Tensor], contiguous: bool = True) -> dict[str, torch.Tensor]:
    """val/agree/h{k}; the chain metrics and the tokens-per-forward estimate only for contiguous offsets
    (a leap leaves draft slots no head fills, so no decoder accepts that chain)."""
    agree = ratio(totals["agreed"], totals["compared"])
    chain = ratio(totals["chain_agreed"], totals["chain_rows"])
    metrics, reach, estimate = {}, torch.tensor(1.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
    for k in range(2, agree.numel() + 1):
        metrics[f"val/agree/h{k}"] = agree[k - 1]
        if not contiguous:
            continue
        metrics[f"val/agree_chain/h{k}"] = chain[k - 1]
        reach = reach * chain[k - 1]  # P(drafts 2..k all accepted)
        estimate = estimate + reach
    if agree.numel() > 1 and contiguous:
        metrics["val/est_tokens_per_forward"] = estimate
    return metrics


def top_token_metrics(predicted: torch.Tensor) -> dict[str, torch.Tensor]:
    """From `predicted` [K, V] (how often each horizon's argmax is each id): each horizon's mode and its share."""
    counts = predicted.double()
    top_share, top_id = counts.max(dim=-1)  # [K], [K]
    share = ratio(top_share, counts.sum(-1))  # [K]
    metrics = {}
    for k in range(1, counts.shape[0] + 1):
        metrics[f"val/top_token/h{k}"] = top_id[k - 1].double()
        metrics[f"val/top_token_share/h{k}"] = share[k - 1]
    return metrics


def predicted_counts(row_argmax: list[torch.Tensor], vocab: int) -> torch.Tensor:
    """[K, V]: per horizon, how many supervised rows have each id as their argmax (-1 rows left out)."""
    return torch.stack([torch.bincount(choice[choice >= 0].flatten(), minlength=vocab)[:vocab] for choice in row_argmax])


class DraftAgreement(pl.Callback):
    def __init__(self):
        self._totals: dict[str, torch.Tensor] = {}

    def on_validation_epoch_start(self, trainer, pl_module):
        self._totals = {}

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        row_argmax = outputs["stats"].row_argmax
        if row_argmax is None or len(row_argmax) < 2:
            return
        for name, value in agreement_counts(row_argmax, pl_module.model.head.offsets).items():
            self._totals[name] = self._totals.get(name, 0) + value.cpu()
        vocab = int(pl_module.model.trunk.unembedding.shape[0])
        self._totals["predicted"] = self._totals.get("predicted", 0) + predicted_counts(row_argmax, vocab).cpu()  # [K, V]

    def on_validation_epoch_end(self, trainer, pl_module):
        if not self._totals or trainer.sanity_checking:
            return
        totals = {name: pl_module.all_reduce_sum(value.to(pl_module.device)).cpu() for name, value in self._totals.items()}
        metrics = {**agreement_metrics(totals, pl_module.model.head_cfg.contiguous_offsets), **top_token_metrics(totals["predicted"])}
        pl_module.log_dict({name: value.float() for name, value in metrics.items()}, on_epoch=True, sync_dist=False, batch_size=1)


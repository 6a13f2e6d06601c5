"""One training step of `MTPLitModule` per case, on 1 process or on a real 2-process DDP.

Launched by tests/test_ddp.py as a standalone script (never imported by pytest):

    python tests/ddp_worker.py --devices {1,2} --cases CASES.json --out RESULT.pt

With `--devices 2` Lightning's DDP strategy (gloo, CPU) re-executes this very script
for rank 1 (same arguments, LOCAL_RANK set), so both ranks run the same loop over the
cases; the process group is created by the first Trainer and reused by the others.

The global batch is fixed: 4 rows x S=16, two documents per row, rows 0-1 full and
rows 2-3 heavily padded (plus one masked hole), so the ranks hold very different
valid counts at every horizon. Rank r of W trains on rows [r*4/W, (r+1)*4/W); the
1-process run trains on all 4 rows in one batch.

For each case the worker records, after exactly one step, every parameter's gradient
(read in `on_before_optimizer_step`, i.e. after DDP's all-reduce and before AdamW
changes the weights), the step's loss (`StepOutputs.loss` from `training_step`, plus
the logged `train/loss` as a cross-check) and every per-horizon metric the real
`HorizonMetrics` callback logged (`train/{loss,acc,count,weight_eff,lambda,coef}/h{k}`).
Rank 0 writes RESULT.pt; other ranks write RESULT.pt.rank{r} so the test can check the
ranks agree (DDP gradients are averaged, hence identical on every rank).

CASES.json is a list of {"name", "head", "reduction", "schedule"} dicts (the config dicts
of `MTPLitModule`; optional "weights", default geometric γ = 0.5, i.e. non-uniform λ).
A case with "validate": {data options} instead runs `Trainer.validate` on a real
`LMDataModule` (cache under --cache-dir) and records the logged `val/*` metrics and the
rows each rank validated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import pytorch_lightning as pl  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from lab.callbacks.horizon_metrics import HorizonMetrics  # noqa: E402
from lab.data import LMDataModule  # noqa: E402
from lab.training.module import MTPLitModule  # noqa: E402

SEED = 1234
VOCAB = 37
SEQ = 16
PAD = 0
ROWS = 4

MODEL = {
    "vocab_size": VOCAB,
    "d_model": 16,
    "n_layers": 2,
    "n_heads": 2,
    "mlp_ratio": 2,
    # 0.2 (not the default 0.02) so every path carries gradients well above rounding noise.
    "init_std": 0.2,
}
OPTIM = {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1, "warmup_steps": 1, "min_lr_ratio": 0.1, "grad_clip": None}
# Non-uniform λ, so that e.g. the `global` and `weighted_pair` policies differ.
WEIGHTS = {"name": "geometric", "gamma": 0.5}

# Document lengths per row (the rest of the row is padding). Rows 0-1 (rank 0) are full,
# rows 2-3 (rank 1) are mostly padding.
DOCS = [(9, 7), (6, 10), (5, 4), (6, 3)]
HOLE = (2, 1)  # (row, position): a masked hole inside a document (active False, segment kept)


def global_batch() -> dict:
    """The fixed [4, 16] global batch (the batch dict of docs/tensor-conventions.md)."""
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(1, VOCAB, (ROWS, SEQ), generator=g)
    segments = torch.full((ROWS, SEQ), -1, dtype=torch.long)
    positions = torch.zeros((ROWS, SEQ), dtype=torch.long)
    for row, lengths in enumerate(DOCS):
        start = 0
        for doc, length in enumerate(lengths):
            segments[row, start : start + length] = doc
            positions[row, start : start + length] = torch.arange(length)
            start += length
    active = segments >= 0
    active[HOLE] = False
    tokens[segments < 0] = PAD
    positions[segments < 0] = 0
    return {"tokens": tokens, "active": active, "segment_ids": segments, "position_ids": positions}


class FixedRows(pl.LightningDataModule):
    """One batch per epoch: this rank's contiguous share of the global batch."""

    def train_dataloader(self):
        world, rank = self.trainer.world_size, self.trainer.global_rank
        per = ROWS // world
        rows = slice(rank * per, (rank + 1) * per)
        batch = {key: value[rows].clone() for key, value in global_batch().items()}
        return DataLoader([batch], batch_size=None, shuffle=False)


class Capture(pl.Callback):
    """Gradients after the (single) backward and all-reduce, before the optimizer changes weights."""

    def __init__(self):
        self.grads = None
        self.outputs = None
        self.steps_seen = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps_seen += 1
        self.grads = {
            name: (torch.zeros_like(p) if p.grad is None else p.grad.detach().clone())
            for name, p in pl_module.model.named_parameters()
        }
        self.grad_none = sorted(name for name, p in pl_module.model.named_parameters() if p.grad is None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.outputs = outputs
        self.local_rows = int(batch["tokens"].shape[0])


class ValidationRows(pl.Callback):
    """Rows this rank validated."""

    def __init__(self):
        self.rows = 0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.rows += int(batch["tokens"].shape[0])


def build_module(case: dict, total_steps: int) -> MTPLitModule:
    pl.seed_everything(SEED, workers=True, verbose=False)
    return MTPLitModule(
        model={**MODEL, **case.get("model", {})},
        head={"compute_match": "next_token_path", **case["head"]},  # 2 layers: the head blocks sit beside the trunk
        reduction=dict(case["reduction"]),
        weights=dict(case.get("weights", WEIGHTS)),
        schedule=dict(case["schedule"]),
        optim=dict(OPTIM),
        total_steps=total_steps,
        objective=case.get("objective"),
    )


def trainer_for(devices: int, callbacks: list, **options) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        num_nodes=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        **options,
    )


def logged(trainer: pl.Trainer, prefix: str) -> dict:
    return {name: value.detach().to(torch.float64).clone() for name, value in trainer.callback_metrics.items() if name.startswith(prefix)}


def run_validation_case(case: dict, devices: int, cache_dir: str) -> dict:
    datamodule = LMDataModule(**case["validate"], cache_dir=cache_dir)
    module = build_module({**case, "model": {"vocab_size": datamodule.vocab_size}}, total_steps=1)
    rows = ValidationRows()
    trainer = trainer_for(devices, [HorizonMetrics(), rows])
    trainer.validate(module, datamodule=datamodule, verbose=False)
    return {
        "val": logged(trainer, "val/"),
        "val_rows_this_rank": rows.rows,
        "world_size": dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1,
        "global_rank": trainer.global_rank,
    }


def run_case(case: dict, devices: int, cache_dir: str) -> dict:
    if "validate" in case:
        return run_validation_case(case, devices, cache_dir)
    module = build_module(case, total_steps=1)
    capture = Capture()
    trainer = trainer_for(
        devices, [capture, HorizonMetrics(log_every_n_steps=1)],
        max_steps=1, max_epochs=1, use_distributed_sampler=False, limit_val_batches=0,
    )
    trainer.fit(module, datamodule=FixedRows())
    if capture.steps_seen != 1 or capture.outputs is None:
        raise RuntimeError(f"case {case['name']}: expected exactly one optimizer step, saw {capture.steps_seen}")
    out = capture.outputs
    return {
        "loss": out["loss"].detach().to(torch.float64).clone(),
        "logged_loss": trainer.callback_metrics["train/objective"].detach().to(torch.float64).clone(),
        "grads": capture.grads,
        "grad_none": capture.grad_none,
        "horizon_metrics": logged(trainer, "train/"),
        "lambdas": out["step"].lambdas.detach().clone(),
        "counts": out["step"].counts.detach().clone(),
        "local_counts": torch.as_tensor(out["step"].local_counts).detach().clone(),
        "local_rows": capture.local_rows,
        "world_size": dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1,
        "trainer_world_size": trainer.world_size,
        "global_rank": trainer.global_rank,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, choices=(1, 2), required=True)
    parser.add_argument("--cases", required=True, help="JSON list of cases")
    parser.add_argument("--out", required=True, help="torch.save target of rank 0")
    parser.add_argument("--cache-dir", required=True, help="dataset cache of the validation cases")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)  # same kernels/threading in both runs; 2 ranks share 2 cores
    with open(args.cases) as handle:
        cases = json.load(handle)

    results, rank = {}, 0
    for case in cases:
        result = run_case(case, args.devices, args.cache_dir)
        rank = result["global_rank"]
        results[case["name"]] = result
        if rank == 0:
            summary = f"loss {result['loss'].item():.6f}" if "loss" in result else f"val/loss {result['val']['val/loss'].item():.6f}"
            print(f"[ddp_worker devices={args.devices}] {case['name']}: {summary}", flush=True)
    path = args.out if rank == 0 else f"{args.out}.rank{rank}"
    torch.save(results, path + ".tmp")
    os.replace(path + ".tmp", path)
    if dist.is_available() and dist.is_initialized():
        # Rank 0's exit ends the test's wait, so it must not leave before rank 1's file is on disk.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Results are on disk; skip interpreter finalisation (several seconds with torch +
    # Lightning loaded on a busy 2-core machine, paid once per rank).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

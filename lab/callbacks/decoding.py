"""Live decoding evaluation at the end of training: plain vs speculative on held-out prompts.

On global rank 0, after the last step: a few prompts cut from the starts of validation
documents (positions from 0, as in training), each decoded plainly (KV-cached) and
speculatively with the run's own heads, greedy by default, interleaved prompt by prompt.
Logs (and adds to the run's final metrics):

    decode/tokens_per_forward   emitted tokens / target forwards (speculative; 1.0 for ntp)
    decode/accept/p{j}          acceptance rate of draft position j
    decode/speedup              decode-phase tokens/s, speculative / plain, same prompts
    decode/greedy_match         fraction of prompts whose speculative output equals the plain one
    decode/distinct4            mean distinct-4-gram ratio of the plain continuations

and writes `decoding.json` in the run dir (settings, per-prompt tokens, ledgers, the
`degenerate` flag of each continuation: < 20 % distinct 4-grams). Cheap by default
(4 prompts × 64 tokens, greedy); the honest headline (sampling, 16 × 128) is the benchmark's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytorch_lightning as pl
import torch

from lab.decode.evaluation import document_prompts, evaluate_decoding


class DecodingEval(pl.Callback):
    def __init__(self, output_dir: str | None = None, prompts: int = 4, prompt_tokens: int = 32, new_tokens: int = 64,
                 temperature: float = 0.0, seed: int = 0):
        self.output_dir, self.n_prompts, self.prompt_tokens = output_dir, prompts, prompt_tokens
        self.new_tokens, self.temperature, self.seed = new_tokens, temperature, seed
        self._evaluated = False

    def on_train_end(self, trainer, pl_module):
        self._evaluate_once(trainer, pl_module)

    def on_fit_end(self, trainer, pl_module):
        # A run resumed from a checkpoint already at trainer.max_steps (its previous attempt died after
        # the last step, before the end was recorded) skips Lightning's training loop and with it
        # on_train_end: the evaluation that attempt never recorded happens here, at the same step.
        if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
            device = trainer.strategy.root_device  # the strategy's teardown moved the model to the CPU
            pl_module.to(device)
            self._evaluate_once(trainer, pl_module)
            pl_module.cpu()

    def _evaluate_once(self, trainer, pl_module):
        if self._evaluated or not trainer.is_global_zero or trainer.datamodule is None or self.n_prompts < 1:
            return
        self._evaluated = True
        model = pl_module.model
        was_training = model.training
        prompts = document_prompts(trainer.datamodule.val_dataloader(), self.n_prompts, self.prompt_tokens)
        if not prompts:
            return
        report = self.evaluate(model, prompts)
        model.train(was_training)
        metrics = report["metrics"]
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        trainer.callback_metrics.update({name: torch.tensor(value) for name, value in metrics.items()})
        out = Path(self.output_dir or trainer.default_root_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "decoding.json").write_text(json.dumps(report, indent=2, sort_keys=True))

    def evaluate(self, model, prompts: list[list[int]]) -> dict:
        return evaluate_decoding(model, prompts, self.new_tokens, self.temperature, self.seed)

"""Live decoding evaluation at the end of training: plain vs speculative on held-out prompts.

On global rank 0, after the last step: a few prompts cut from the starts of validation
documents (positions from 0, as in training), each decoded plainly (KV-cached) and
speculatively with the run's own heads, under exact speculative *sampling* at T = 1 (the
headline) and, with `greedy`, greedy as well. Each prompt is decoded `repeats` times on each side,
plain and speculative back to back (lab.decode.paired), so a change of machine load hits both. A
continuation with < 20 % distinct 4-grams is `degenerate` and left out of the headline (a
small model's greedy output often repeats one token, and then every draft is "accepted").
Logs (and adds to the run's final metrics), headline over the non-degenerate prompts:

    decode/tokens_per_forward   emitted tokens / target forwards (speculative; 1.0 for ntp)
    decode/accept/p{j}          unconditional acceptance of draft position j: P(accepted prefix ≥ j)
    decode/accept_cond/p{j}     conditional: P(position j accepted | 1..j−1 accepted)
    decode/mean_accept_len      tokens per verification, bonus/correction included (τ; 1.00 plain)
    decode/mean_accepted        drafts accepted per verification (bonus excluded)
    decode/speedup              median over (prompt, repeat) pairs of tokens/s speculative ÷ plain, wall time
                                (`_q1`/`_q3`: quartiles; `decode/speedup_cpu*`: the same from the worker's CPU time)
    decode/contended            1 when the machine did not let the evaluation run (lab.tracking.timing), with
                                decode/cpu_share, decode/load_start, decode/load_end, decode/threads
    decode/distinct4            mean distinct-4-gram ratio of the measured continuations (all prompts)
    decode/degenerate           fraction of prompts whose continuation is degenerate
    decode/prompts_clean        prompts the headline averages over
    decode/greedy/...           the same under greedy decoding (all prompts, and degenerate ones flagged)
    decode/greedy/greedy_match  fraction of prompts whose greedy speculative output equals the plain one

and writes `decoding.json` in the run dir (settings, per-prompt tokens and flags, ledgers).
Cheap by default (4 prompts × 64 tokens × 3 repeats). `budget_s` bounds its time (lab.callbacks.decoding_budget):
`auto` (the default) = the training time just measured, a number of seconds, or null for none; a probe
of the model's per-token cost sizes prompts × tokens × repeats to fit, and the plan with its expected
time is printed before it starts; a progress bar counts the requests.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytorch_lightning as pl
import torch

from lab.callbacks.decoding_budget import DecodePlan, budget_seconds, plan_decoding
from lab.callbacks.throughput import TokenThroughput
from lab.decode.evaluation import decoding_passes, document_prompts, evaluate_decoding, requests_per_prompt
from lab.errors import is_int, is_number, require


def check_decoding_options(prompts=4, prompt_tokens=32, new_tokens=64, temperature=1.0, repeats=3, budget_s="auto", **_) -> None:
    """The ranges of `callbacks.decoding`'s options (the types are the constructor's annotations): run when the
    callback is built and, before the run folder exists, by lab/config/checks.py."""
    def count(name: str, value, least: int) -> None:
        require(is_int(value) and value >= least, f"callbacks.decoding.{name}",
                f"is {value!r}; allowed: an integer >= {least}" + (" (0 = no evaluation)" if least == 0 else ""))

    count("prompts", prompts, 0)
    count("prompt_tokens", prompt_tokens, 1)
    count("new_tokens", new_tokens, 1)
    count("repeats", repeats, 1)
    require(is_number(temperature) and temperature >= 0, "callbacks.decoding.temperature",
            f"is {temperature!r}; allowed: a number >= 0 (0 = greedy)")
    require(budget_s is None or budget_s == "auto" or (is_number(budget_s) and budget_s > 0), "callbacks.decoding.budget_s",
            f"is {budget_s!r}; allowed: auto (the training time), a number of seconds > 0, or null (no limit)")


class DecodingEval(pl.Callback):
    def __init__(self, output_dir: str | None = None, prompts: int = 4, prompt_tokens: int = 32, new_tokens: int = 64,
                 temperature: float = 1.0, greedy: bool = True, seed: int = 0, repeats: int = 3, budget_s: float | str | None = "auto"):
        check_decoding_options(prompts=prompts, prompt_tokens=prompt_tokens, new_tokens=new_tokens, temperature=temperature,
                               repeats=repeats, budget_s=budget_s)
        self.output_dir, self.n_prompts, self.prompt_tokens = output_dir, prompts, prompt_tokens
        self.new_tokens, self.temperature, self.greedy, self.seed = new_tokens, temperature, greedy, seed
        self.repeats, self.budget_s = repeats, budget_s
        self._evaluated = False
        self._train_start: float | None = None

    def on_train_start(self, trainer, pl_module):
        self._train_start = time.perf_counter()

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
        plan = self.plan(model, prompts, budget_seconds(self.budget_s, self.training_seconds(trainer)))
        report = self.evaluate(model, prompts[: plan.prompts], plan)
        model.train(was_training)
        metrics = report["metrics"]
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        trainer.callback_metrics.update({name: torch.tensor(value) for name, value in metrics.items()})
        out = Path(self.output_dir or trainer.default_root_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "decoding.json").write_text(json.dumps(report, indent=2, sort_keys=True))

    def training_seconds(self, trainer) -> float | None:
        """This run's measured training time: every attempt's (the throughput callback's), else this attempt's."""
        meters = [c for c in trainer.callbacks if isinstance(c, TokenThroughput)]
        if meters and meters[0].summary():
            return meters[0].summary()["fit_time_s"]
        return None if self._train_start is None else time.perf_counter() - self._train_start

    def plan(self, model, prompts: list[list[int]], budget_s: float | None) -> DecodePlan:
        """The evaluation that fits `budget_s`, printed with its expected time before it starts."""
        plan = plan_decoding(model, prompts[0], min(self.n_prompts, len(prompts)), self.new_tokens, self.repeats,
                             decoding_passes(self.greedy, self.temperature), budget_s)
        print(plan.describe(), flush=True)
        return plan

    def evaluate(self, model, prompts: list[list[int]], plan: DecodePlan | None = None) -> dict:
        """Decode `prompts` as `plan` says (default: as configured, no budget), with a progress bar over the requests."""
        from tqdm.auto import tqdm

        new_tokens, repeats = (self.new_tokens, self.repeats) if plan is None else (plan.new_tokens, plan.repeats)
        total = len(prompts) * requests_per_prompt(model.head.can_draft, self.greedy, self.temperature, repeats)
        started = time.perf_counter()
        with tqdm(total=total, desc="decoding", unit="request", disable=None, leave=False) as bar:
            report = evaluate_decoding(model, prompts, new_tokens, self.temperature, self.greedy, self.seed, repeats, tick=bar.update)
        if plan is not None:
            report["budget"] = plan.record() | {"took_s": time.perf_counter() - started}
        return report

"""HumanEval at the end of training (opt-in: `callbacks.humaneval.problems=all`, or a number for the first N).

The same evaluation as `lab-eval RUN --task humaneval` (lab/eval/evaluate.py), on global rank 0 after the
last step, with the run's model and tokenizer: `<run>/eval/humaneval.jsonl` and `.json`, and
`eval/humaneval/pass@k`, `…/tokens_per_forward` and `…/decode_tokens_per_s` among the run's final
metrics (so runs.csv and the sweep report carry them). Whether the run's tokenizer can encode every
prompt is checked when training starts, so a run that could not be scored fails before it trains.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytorch_lightning as pl
import torch

from lab.errors import is_int, is_number, require
from lab.eval.evaluate import EvalSettings, check_settings

PREFIX = "callbacks.humaneval."


def settings_from(problems: int | str = 0, samples: int = 1, temperature: float = 0.0, k=(1,), max_new_tokens: int = 256,
                  speculative: bool = False, seed: int = 0, wall_s: float = 10.0, **_) -> EvalSettings | None:
    """The evaluation `callbacks.humaneval` asks for (None: off), its ranges checked; also run by lab/config/checks.py."""
    require(problems == "all" or (is_int(problems) and problems >= 0), f"{PREFIX}problems",
            f"is {problems!r}; allowed: 0 (off), a number of problems (the first N), or all")
    if problems == 0:
        return None
    ks = k_values(k)
    require(bool(ks) and all(is_int(v) for v in ks), f"{PREFIX}k",
            f"is {k!r}; allowed: an integer or a list of integers (the k of pass@k), each ≤ samples")
    for name, value, kind in (("samples", samples, is_int), ("max_new_tokens", max_new_tokens, is_int), ("seed", seed, is_int),
                              ("temperature", temperature, is_number), ("wall_s", wall_s, is_number)):
        require(kind(value), f"{PREFIX}{name}", f"is {value!r}; allowed: {'an integer' if kind is is_int else 'a number'}")
    require(isinstance(speculative, bool), f"{PREFIX}speculative", f"is {speculative!r}; allowed: true or false")
    settings = EvalSettings("humaneval", samples, temperature, ks, max_new_tokens, None if problems == "all" else problems, speculative,
                            False, seed, wall_s)
    check_settings(settings, prefix=PREFIX)
    return settings


def k_values(k) -> tuple:
    """`k: 10` or `k: [1, 10]` as a tuple; () for anything else (a string, a mapping)."""
    if is_int(k):
        return (k,)
    if isinstance(k, (str, dict)) or not hasattr(k, "__iter__"):
        return ()
    return tuple(k)


class HumanEvalAtEnd(pl.Callback):
    def __init__(self, output_dir: str | None = None, **options):
        self.output_dir = output_dir
        self.settings = settings_from(**options)
        self._evaluated = False

    def on_train_start(self, trainer, pl_module):
        if self.settings is not None and trainer.is_global_zero and trainer.datamodule is not None:
            from lab.eval.evaluate import prompt_ids

            prompt_ids(trainer.datamodule.tokenizer, self.settings.limit)  # refuses a tokenizer that cannot encode the prompts

    def on_train_end(self, trainer, pl_module):
        if self.settings is None or self._evaluated or not trainer.is_global_zero or trainer.datamodule is None:
            return
        from lab.eval.evaluate import evaluate, final_metrics

        self._evaluated = True
        model = pl_module.model
        was_training = model.training
        with torch.no_grad():
            rows, summary = evaluate(model, trainer.datamodule.tokenizer, self.settings)
        model.train(was_training)
        out = Path(self.output_dir or trainer.default_root_dir) / "eval"
        out.mkdir(parents=True, exist_ok=True)
        (out / "humaneval.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        (out / "humaneval.json").write_text(json.dumps(summary, indent=2) + "\n")
        metrics = final_metrics(summary)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        trainer.callback_metrics.update({name: torch.tensor(value) for name, value in metrics.items()})

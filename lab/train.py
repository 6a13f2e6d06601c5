"""`lab-train`: compose (Hydra), validate, instantiate, fit (Lightning), record (run.json).

Bad input ends with one line `error: <field>: <what is allowed>` and exit code 2.
torch and Lightning are imported where a run needs them, never at module level, and `--help`
is answered from conf/ (lab/config/cli_help.py) instead of by Hydra: both answer fast
(experiments/benchmarks/cli_startup.py).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from lab.run.startup_signals import quiet_ctrl_c_while_importing

if __name__ == "__main__" or Path(sys.argv[0]).name == "lab-train":
    quiet_ctrl_c_while_importing("lab-train")  # the imports below take seconds (torch): Ctrl-C there is one line, not 30

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from lab.config.paths import CONF_DIR as CONF_PATH
from lab.config.checks import check_config
from lab.tracking.console import current_wandb_run, quiet_csv_overwrite, quiet_known_noise, summary_line
from lab.tracking.csv_history import keep_csv_history
from lab.errors import ConfigError, RunInterrupted
from lab.config.plugins import load_plugins
from lab.config.preflight import experiment_listing, preflight
from lab.config.resolvers import register_resolvers
from lab.run.attempts import begin_attempt, close_attempt, failure_reason, final_value, nothing_left
from lab.run.guard import check_not_overwriting, check_paths, discard_new_run_dir
from lab.run.orphan import running_job, stop_when_orphaned
from lab.run.record import INTERRUPTED, RunRecord
from lab.run.resume_config import check_resume_config, resumes_own_checkpoint
from lab.run.startup_signals import StartUpInterrupted, ignore_signals, start_up, stop_if_ctrl_c_was_swallowed
from lab.tracking.wandb_reach import check_wandb_reachable
from lab.tracking.wandb_status import finish_wandb, mark_wandb_run_failed

if TYPE_CHECKING:
    from lab.model.heads import HeadConfig

CONF_DIR = str(CONF_PATH)  # as hydra.main takes it


def build(cfg: DictConfig, record: RunRecord | None = None):
    """Validate and construct the DataModule and the LightningModule (every start-up check)."""
    import pytorch_lightning as pl

    from lab.checkpoint import build_manifest
    from lab.training.run_data import run_datamodule
    from lab.model.cost import cost_table, format_cost_table
    from lab.training.module import MTPLitModule

    from lab.nn.draft_vocab import choose_draft_vocab
    from lab.model.mtp import check_vocabulary, fill_vocab_size

    checked = check_config(cfg, noted=settle_unused_settings(cfg, record))
    if record is not None:
        record.update(**head_fields(checked.head))
    pl.seed_everything(cfg.seed, workers=True, verbose=False)  # the seed is in the run record; stderr stays for errors
    quiet_dataset_progress(cfg)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    settle_model_dtype(model_cfg, record)
    datamodule = run_datamodule(OmegaConf.to_container(cfg.data, resolve=True), model_cfg)  # model=hf: the model's own tokenizer
    fill_vocab_size(model_cfg, datamodule.vocab_size)
    module = MTPLitModule(
        model=model_cfg,
        head=OmegaConf.to_container(cfg.head, resolve=True),
        reduction=OmegaConf.to_container(cfg.reduction, resolve=True),
        weights=OmegaConf.to_container(cfg.weights, resolve=True),
        schedule=OmegaConf.to_container(cfg.schedule, resolve=True),
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        total_steps=int(cfg.trainer.max_steps),
        objective=OmegaConf.to_container(cfg.objective, resolve=True) if cfg.get("objective") is not None else None,
        checked=checked,  # head, optim and objective as check_config typed them
    )
    settle_threads(cfg, record, module.model)  # before anything reduces: the weights above are drawn elementwise
    datamodule.setup("fit")
    check_vocabulary(module.model, datamodule.tokenizer.vocab_size)
    if cfg.get("init_from"):
        from lab.release.init_from import load_parent_weights

        module.init_from = load_parent_weights(module.model, str(cfg.init_from), datamodule.tokenizer_identity)
    use_generated_rows(cfg, checked.train_rows, datamodule, module.model, record)  # after init_from: the weights that train write
    draft_vocab = choose_draft_vocab(module.model, datamodule.training_rows)  # head.draft_vocab: this run's own training counts
    if record is not None and draft_vocab is not None:
        record.update(draft_vocab=draft_vocab)
    use_hidden_cache(cfg, datamodule, module.model, record)  # after init_from: the cache holds the states of the weights that train
    if record is not None:
        cost = cost_table(module.model, int(cfg.data.seq_len))
        print("cost:\n" + format_cost_table(cost))
        record.update(cost=cost, manifest=build_manifest(module, datamodule), corpus_stats=datamodule.corpus_stats)
    return datamodule, module


def settle_unused_settings(cfg: DictConfig, record: RunRecord | None) -> frozenset[str]:
    """A sweep job's settings that change nothing (or those a resumed sweep job noted before): noted, recorded and run
    at their defaults (a single run refused them before its folder existed; lab/config/unused.py). The noted fields."""
    from lab.config.checks import in_sweep_job, typed_head
    from lab.config.unused import settle_unused_for_sweep_job, unused_settings

    noted_before = {entry["field"] for entry in ((record.previous or {}).get("unused_settings") or [])} if record is not None else set()
    found = unused_settings(cfg, typed_head(cfg))
    if not in_sweep_job():
        found = [setting for setting in found if setting.field in noted_before]
    if not found:
        return frozenset()
    settled = settle_unused_for_sweep_job(cfg, found)
    if record is not None:
        record.update(unused_settings=settled, config=OmegaConf.to_container(cfg, resolve=True))  # the config the job runs
    return frozenset(setting.field for setting in found)


def use_generated_rows(cfg: DictConfig, train_rows, datamodule, model, record: RunRecord | None) -> None:
    """`train_rows=generated`: the model's own continuations in place of the corpus rows, written once under
    paths.cache_dir by the weights that train (after init_from) and shared by later runs."""
    if train_rows is None or train_rows.source != "generated":
        return
    from lab.decode.generated_rows import train_from_generated_rows

    generated = train_from_generated_rows(datamodule, model, train_rows, train_rows.sampling_seed(cfg.seed), Path(cfg.paths.cache_dir) / "generated")
    if record is not None:
        record.update(generated_rows=generated)


def use_hidden_cache(cfg: DictConfig, datamodule, model, record: RunRecord | None) -> None:
    """`hidden_cache=true`: the frozen trunk's states of whichever rows train, built once under paths.cache_dir."""
    if not cfg.get("hidden_cache"):
        return
    from lab.training.hidden_cache import train_from_hidden_cache

    cache = train_from_hidden_cache(datamodule, model, Path(cfg.paths.cache_dir) / "hidden")
    if record is not None:
        record.update(hidden_cache=cache)


def head_fields(head: "HeadConfig") -> dict:
    """run.json's `k` (a DeepSeek head's follows from its depth) and `head_traits` (baseline, teacher-forced
    metrics, display rank): what lab-report reads of the head instead of asking lab.model."""
    from lab.model.heads import report_traits

    return {"k": head.k, "head_traits": report_traits(head.name)}


def settle_model_dtype(model_cfg: dict, record: RunRecord | None) -> None:
    """`model.dtype=auto` becomes the dtype this machine computes fastest, once, said and recorded; the module's
    hyperparameters (and so its checkpoints) keep the concrete dtype, so a reload elsewhere computes the same."""
    from lab.model.dtype_choice import AUTO, resolve_dtype

    if model_cfg.get("dtype") != AUTO:
        return
    choice = resolve_dtype(AUTO)
    model_cfg["dtype"] = choice.name
    print(f"model.dtype=auto: {choice.name} ({choice.reason})", flush=True)
    if record is not None:
        record.update(model_dtype={"setting": AUTO, "resolved": choice.name, "reason": choice.reason})


def settle_threads(cfg: DictConfig, record: RunRecord | None, model) -> None:
    """`trainer.threads` from the config and the model's size (lab/training/threads.py), a resume's from its record;
    applied, said once and recorded with the rest of the run's numerics fingerprint (lab/tracking/numerics.py)."""
    from lab.training.threads import apply_threads, choose_threads

    params = sum(p.numel() for p in model.parameters())
    choice = choose_threads(cfg.trainer.get("threads", "auto"), params, jobs_side_by_side(), recorded_threads(cfg, record))
    apply_threads(choice)
    if record is not None:
        from lab.tracking.numerics import numerics_fingerprint

        print(f"threads: {choice.threads} ({choice.reason})", flush=True)
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        record.update(threads=choice.record(), numerics=numerics_fingerprint(choice.threads, dtype, cfg.trainer.get("precision")))


def jobs_side_by_side() -> int:
    """The jobs a parallel (joblib) sweep runs at once, 1 for a single run or a sequential sweep."""
    if not in_multirun():
        return 1
    launcher = HydraConfig.get().launcher
    return int(launcher.get("n_jobs") or 1) if "joblib" in str(launcher.get("_target_", "")).lower() else 1


def recorded_threads(cfg: DictConfig, record: RunRecord | None) -> int | None:
    """The thread count a resumed run computed on (None: not a resume of a recorded run)."""
    if record is None or not resumes_own_checkpoint(cfg.ckpt_path, record.path.parent):
        return None
    return ((record.previous or {}).get("threads") or {}).get("threads")


def prepare(cfg: DictConfig, record: RunRecord):
    """Every check, the checkpoint's included, before the run dir is touched: (datamodule, module, ckpt path, its step)."""
    from lab.checkpoint import build_manifest, validate_checkpoint

    check_paths(cfg)
    check_wandb_reachable(cfg)  # WANDB_MODE=online without a network: one line now, not a traceback minutes into the run
    datamodule, module = build(cfg, record)
    ckpt_path = resolve_ckpt_path(cfg)
    resume_step = None
    if ckpt_path is not None:
        # Refuse a damaged file or another experiment's checkpoint before the Trainer touches the run dir.
        resume_step = int(validate_checkpoint(ckpt_path, build_manifest(module, datamodule), module)["global_step"])
    return datamodule, module, ckpt_path, resume_step


def fit(cfg: DictConfig, record: RunRecord, datamodule, module, ckpt_path: str | None, resume_step: int | None):
    from pytorch_lightning.utilities.exceptions import SIGTERMException

    from lab.callbacks.run_heartbeat import RunHeartbeat
    from lab.callbacks.stop_on_signal import StopOnSignal
    from lab.callbacks.throughput import TokenThroughput
    from lab.checkpoint import build_manifest
    from lab.checkpoint.io import SafeCheckpointIO
    from lab.tracking.wandb_logger import LOGGED_RECORD_FIELDS

    stop = StopOnSignal()
    callbacks = instantiate_callbacks(cfg) + [RunHeartbeat(record), stop]
    loggers = [hydra.utils.instantiate(c) for c in (cfg.get("logger") or {}).values()]
    log_run_config(loggers, cfg)
    previous_metrics = (Path(cfg.paths.output_dir) / "metrics.csv").exists()
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, plugins=[SafeCheckpointIO()],
                                      enable_progress_bar=progress_bar(cfg))
    with quiet_csv_overwrite(previous_metrics, resuming=resume_step is not None):
        if resume_step is not None:  # opens the CSV logger's folder: its "will be deleted" alarm is false on a resume
            keep_csv_history(loggers, resume_step)
        for logger in loggers:  # wandb's run config and the CSV logger's hparams.yaml carry the model's cost and the head's K and traits
            logger.log_hyperparams({name: record.fields.get(name) for name in LOGGED_RECORD_FIELDS})
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
        except SIGTERMException:  # Lightning's stop after a SIGTERM (or a SIGINT, see StopOnSignal)
            raise stop.interrupted(trainer) from None
        except SystemExit:  # Lightning's exit(1) after a KeyboardInterrupt: a second Ctrl-C before the step ended
            if stop.signum is None:
                raise
            raise stop.interrupted(trainer) from None
    late = stop.late_signal_note(trainer)
    if late:  # the signal came after the last step (in the final validation or evaluation): the work is complete
        record.attempt["late_signal"] = late
        print(f"note: {late}", file=sys.stderr, flush=True)
    record.update(manifest=build_manifest(module, datamodule))  # with the final weight-schedule position
    measured = [c.summary() for c in callbacks if isinstance(c, TokenThroughput)]
    if measured:
        record.update(cost={**record.fields.get("cost", {}), **measured[0]})
    return trainer


def progress_bar(cfg: DictConfig) -> bool:
    """`trainer.enable_progress_bar`, and never in a multirun: its jobs run side by side and their bars would interleave
    (each prints a progress line every 30 s instead: ProgressLines, lab/callbacks/progress.py)."""
    return bool(cfg.trainer.get("enable_progress_bar", True)) and not in_multirun()


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def quiet_dataset_progress(cfg: DictConfig) -> None:
    """No progress bar (`trainer.enable_progress_bar=false`, a multirun) silences datasets' bars too (so a refused corpus
    prints only its error)."""
    if not progress_bar(cfg):
        import datasets

        datasets.disable_progress_bars()


def instantiate_callbacks(cfg: DictConfig) -> list:
    """The config's callbacks; the progress bar is dropped when the Trainer disables it (Lightning refuses it then)."""
    from pytorch_lightning.callbacks import ProgressBar

    callbacks = [hydra.utils.instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]  # null: left out
    if not progress_bar(cfg):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    return callbacks


def log_run_config(loggers: list, cfg: DictConfig) -> None:
    """Every logger that takes it gets the resolved config, run dir, overrides and sweep name."""
    for logger in loggers:
        if hasattr(logger, "log_run_config"):
            logger.log_run_config(
                OmegaConf.to_container(cfg, resolve=True), run_dir=str(cfg.paths.output_dir),
                overrides=list(HydraConfig.get().overrides.task), sweep_name=cfg.get("sweep_name"),
            )


def resolve_ckpt_path(cfg: DictConfig) -> str | None:
    if cfg.ckpt_path in (None, "last"):
        last = Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"
        if cfg.ckpt_path == "last" and not last.exists():  # a typo in hydra.run.dir must not go unnoticed
            print(f"ckpt_path=last: no checkpoint at {last}; training from step 0", file=sys.stderr)
        return str(last) if cfg.ckpt_path == "last" and last.exists() else None
    return str(cfg.ckpt_path)  # its existence: lab.config.checks.check_run_config


def run(cfg: DictConfig) -> float | None:
    quiet_environment()  # also in launcher worker processes, which never run main()
    register_resolvers()  # a joblib worker process imports this module afresh
    load_plugins()  # so does the registry: the trunk families and heads of installed plugins register again
    stop_when_orphaned()  # a joblib worker whose launcher was killed stops instead of training on
    with running_job():
        return run_job(cfg)


def run_job(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    record = RunRecord(run_dir, list(hydra_cfg.overrides.task))
    record.update(config=OmegaConf.to_container(cfg, resolve=True))
    attempt = None  # set once this attempt is accepted and recorded as running
    try:
        with start_up():  # a signal before training: one line and nothing half-written (lab/run/startup_signals.py)
            check_not_overwriting(cfg.ckpt_path, record.finished_ok, run_dir)
            if resumes_own_checkpoint(cfg.ckpt_path, run_dir):  # the same run, continued: its recorded config stands
                check_resume_config(record.previous, OmegaConf.to_container(cfg, resolve=True))
            datamodule, module, ckpt_path, resume_step = prepare(cfg, record)
        done = nothing_left(cfg, record, resume_step)
        if done is not None:
            record.nothing_to_do(done)
            print(f"nothing to do: {run_dir}: {done}", file=sys.stderr)
            return final_value(record.previous.get("final_metrics") or {})
        attempt = begin_attempt(record, cfg, run_dir, ckpt_path, resume_step)
        trainer = fit(cfg, record, datamodule, module, ckpt_path, resume_step)
    except StartUpInterrupted as stop:  # nothing trained: a folder this attempt made goes, an existing record stays
        ignore_signals()  # until the exit: the cleanup below must not be interrupted
        removed = discard_new_run_dir(run_dir)
        finish_wandb()
        print(f"interrupted: {run_dir}: {stop}; nothing was trained{' (its new run folder removed)' if removed else ''}",
              file=sys.stderr, flush=True)
        sys.exit(stop.exit_code)
    except RunInterrupted as stop:  # preempted or Ctrl-C: the whole command stops, a sweep's later jobs too
        note = close_attempt(record, attempt, INTERRUPTED, f"{stop}; resume with ckpt_path=last", step=stop.step)
        finish_wandb()
        print(f"interrupted: {run_dir}: {stop}; resume: lab-train <same overrides> hydra.run.dir={run_dir} ckpt_path=last{note}",
              file=sys.stderr, flush=True)
        sys.exit(stop.exit_code)
    except Exception as error:
        reason = failure_reason(error, cfg, run_dir)
        refused_new_run = attempt is None and hydra_cfg.mode == RunMode.RUN and discard_new_run_dir(run_dir)
        if not refused_new_run:  # a refused first attempt leaves no folder behind; any other attempt is recorded
            reason += close_attempt(record, attempt, "failed", reason)
        mark_wandb_run_failed(reason)
        finish_wandb()
        if hydra_cfg.mode == RunMode.MULTIRUN:
            # Recorded as failed in run.json; returning (not raising) lets the sweep go on and
            # the report callback run: Hydra's basic and joblib launchers re-raise the first job
            # exception after the batch, which would skip the remaining batches and on_multirun_end.
            print(f"error: job {hydra_cfg.job.num} ({' '.join(hydra_cfg.overrides.task)}): {reason}", file=sys.stderr)
            return None
        if isinstance(error, (ConfigError, OSError)):
            print(f"error: {error if isinstance(error, ConfigError) else reason}", file=sys.stderr)
            sys.exit(1 if attempt is not None and not isinstance(error, ConfigError) else 2)  # 1: a fault mid-run
        raise
    except BaseException as error:  # KeyboardInterrupt, SystemExit: stop everything, sweep included
        status = INTERRUPTED if isinstance(error, KeyboardInterrupt) else "failed"
        close_attempt(record, attempt, status, f"{type(error).__name__}: {error}")
        finish_wandb()
        raise
    record.finish("ok", metrics=trainer.callback_metrics, step=trainer.global_step)
    wandb_run = current_wandb_run()
    finish_wandb()
    print(summary_line(run_dir, trainer.callback_metrics, trainer.global_step, time.time() - record.started, wandb_run), flush=True)
    return final_value(trainer.callback_metrics)


@hydra.main(config_path=CONF_DIR, config_name="train", version_base="1.3")
def hydra_main(cfg: DictConfig) -> float | None:
    return run(cfg)


def quiet_environment() -> None:
    """What the CLI sets before Hydra starts (never at import: importing lab.train changes nothing)."""
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    quiet_known_noise()  # only the listed library noise (lab/tracking/console.py)


def main() -> None:
    try:
        start()
    except KeyboardInterrupt:  # Ctrl-C while Python imports torch or Hydra composes (before any run folder), or between phases
        print("interrupted: lab-train stopped by SIGINT (a run that had begun an attempt says so in its run.json)",
              file=sys.stderr, flush=True)
        sys.exit(130)


def start() -> None:
    quiet_environment()
    register_resolvers()
    argv = sys.argv[1:]
    if "--help" in argv or "-h" in argv:
        from lab.config.cli_help import help_text

        print(help_text(Path(CONF_DIR)))
        sys.exit(0)
    if "experiment=" in argv:
        print(experiment_listing(Path(CONF_DIR)))
        sys.exit(0)
    try:
        load_plugins()  # trunk families and heads from installed packages (lab/config/plugins.py), before the checks
        preflight(argv, Path(CONF_DIR))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    stop_if_ctrl_c_was_swallowed("lab-train")  # a Ctrl-C during the imports that a library's bare `except:` caught
    hydra_main()


if __name__ == "__main__":
    main()

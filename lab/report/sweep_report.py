"""The sweep-report Hydra callback (registered in conf/hydra/default.yaml under `hydra.callbacks`).

`SweepReport.on_multirun_end` writes the sweep report into the sweep directory once all
jobs have returned. A failed job does not stop the sweep: `lab.train.run` records it in
its run.json and returns, so Hydra's sweeper goes on to the next job (both the basic and
the joblib launcher would otherwise re-raise the first job exception after the batch and
skip `on_multirun_end`). When any job failed, the command exits with status 1 after the
report is written.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from lab.report.records import ReportError


class SweepReport(Callback):
    def __init__(self, enabled: bool = True, log_to_wandb: bool = True, fail_on_failed_jobs: bool = True) -> None:
        self.enabled = enabled
        self.log_to_wandb = log_to_wandb
        self.fail_on_failed_jobs = fail_on_failed_jobs

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if self.enabled and wandb_publish_requested(config):  # refuse before any job runs, not after the sweep
            from lab.report.wandb_report import wandb_workspaces

            try:
                wandb_workspaces(field="report.wandb_publish")
            except ReportError as error:
                print(f"error: {error}", file=sys.stderr)
                sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled:
            return
        from lab.report.build import build_report
        from lab.report.records import collect_sweep

        sweep_dir = Path(str(config.hydra.sweep.dir))
        try:
            sweep = collect_sweep(sweep_dir)
            report = build_report(sweep, sweep_dir, OmegaConf.select(config, "report.baseline"))
        except ReportError as error:
            print(f"error: report: {error}", file=sys.stderr)
            sys.exit(1)
        if self.log_to_wandb:
            self._log_to_wandb(config, report)
        if wandb_publish_requested(config):
            self._publish_to_wandb(config, sweep_dir)
        print(f"report: {report.html} ({report.counts})", file=sys.stderr)
        offline_runs = sorted(Path(sweep_dir, "wandb").glob("offline-run-*"))
        if offline_runs:  # every job's run and the report run (lab.config.resolvers.wandb_dir puts them there)
            print(f"wandb: {len(offline_runs)} offline runs; sync them with: wandb sync {sweep_dir}/wandb/offline-run-*", file=sys.stderr)
        if report.n_not_ok and self.fail_on_failed_jobs:
            what = "failed" if not report.n_other else f"did not finish ok ({report.counts})"
            print(f"error: sweep: {report.n_not_ok} of {report.n_ok + report.n_not_ok} jobs {what} (see {report.markdown})", file=sys.stderr)
            sys.exit(1)

    @staticmethod
    def _log_to_wandb(config: DictConfig, report) -> None:
        wandb_cfg = OmegaConf.select(config, "logger.wandb")
        if wandb_cfg is None:
            return
        try:
            from lab.report.build import log_report_to_wandb

            log_report_to_wandb(
                report, project=str(wandb_cfg.project), group=str(config.sweep_name), mode=str(wandb_cfg.get("mode") or "offline"),
                entity=wandb_cfg.get("entity"),
            )
        except Exception as error:  # the report on disk is the record; wandb is a copy
            print(f"warning: report not logged to wandb: {type(error).__name__}: {error}", file=sys.stderr)

    @staticmethod
    def _publish_to_wandb(config: DictConfig, sweep_dir: Path) -> None:
        """`report.wandb_publish=true`: the sweep as a wandb Report, after the run-directory report."""
        wandb_cfg = OmegaConf.select(config, "logger.wandb")
        if wandb_cfg is None:
            print("warning: report.wandb_publish: no wandb logger in this sweep (logger.wandb), nothing to publish", file=sys.stderr)
            return
        from lab.report.wandb_report import publish_after_sweep

        try:
            line = publish_after_sweep(
                sweep_dir, project=str(wandb_cfg.project), entity=wandb_cfg.get("entity"), group=str(wandb_cfg.get("group") or config.sweep_name),
                online=str(wandb_cfg.get("mode") or "offline") == "online", workspace=bool(OmegaConf.select(config, "report.wandb_workspace")),
            )
        except Exception as error:  # the report on disk is the record; the wandb Report is a view of it
            print(f"warning: report.wandb_publish: not published: {type(error).__name__}: {error}", file=sys.stderr)
            return
        print(line, file=sys.stderr)


def wandb_publish_requested(config: DictConfig) -> bool:
    return bool(OmegaConf.select(config, "report.wandb_publish") or OmegaConf.select(config, "report.wandb_workspace"))

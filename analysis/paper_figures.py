"""Paper figures from stored run data (no retraining): `python -m analysis.paper_figures SWEEP_DIR --out DIR`.

Every figure is written as PNG, PDF and SVG (text kept as text) with the numbers it draws as CSV beside
it; tables as CSV, Markdown and a LaTeX tabular. A figure with nothing to compare in this sweep (one
point, a constant λ, one schedule) is skipped with one line saying why. Same data → the same bytes.

    --figures a,b          draw only these (names below)
    --label OLD=NEW        show variant OLD (its report label, e.g. head=parallel, or its figure label) as NEW; repeatable
                           (other variants show readable labels: head=parallel head.k=4 → parallel K=4)
    --config paper.yaml    the same as YAML: {figures: [...], labels: {OLD: NEW}, baseline: LABEL}
    --baseline LABEL       the variant differences and relative speeds are taken to (default: ntp, if present)

Small-scale analogues of Gloeckle et al. Table S4 (architectures), Table S5 (relative step time) and
Fig. 2 (memory by backward schedule), Medusa's per-head accuracy and DeepSeek-V3's λ schedule; and the
figures an MTP ablation needs beside them: the reduction × λ-schedule comparison, gradient cosine over
training (per horizon pair and parameter group), per-horizon accuracy and agreement over training, and
quality against cost.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from analysis.figures import FIGURES
from analysis.paper_data import Paper, Skipped
from lab.report.labels import check_label_args
from lab.report.records import ReportError, collect_sweep


def read_config(path: str | None) -> dict:
    if path is None:
        return {}
    try:
        config = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ReportError(f"--config: cannot read {path}: {error}") from None
    unknown = set(config) - {"figures", "labels", "baseline"}
    if not isinstance(config, dict) or unknown:
        raise ReportError(f"--config: {path} may hold figures, labels and baseline; got {', '.join(sorted(unknown)) or type(config).__name__}")
    return config


def chosen_figures(names: list[str] | None) -> list[str]:
    if not names:
        return list(FIGURES)
    unknown = [name for name in names if name not in FIGURES]
    if unknown:
        raise ReportError(f"--figures: unknown {', '.join(unknown)}; allowed: {', '.join(FIGURES)}")
    return list(dict.fromkeys(names))


def regenerate(sweep_dir: str | Path, out: str | Path, figures: list[str] | None = None, labels: dict[str, str] | None = None,
               baseline: str | None = None, label_args: list[str] | None = None) -> dict[str, list[Path] | Skipped]:
    """Every chosen figure: its written files, or why it was skipped. Input is checked before anything is written."""
    sweep = collect_sweep(sweep_dir)
    if not sweep.completed:
        raise ReportError(f"{sweep_dir}: no finished job ({len(sweep.records)} jobs, none ok): nothing to draw")
    names = chosen_figures(figures)
    paper = Paper.of(sweep, labels or {}, baseline, label_args)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    return {name: FIGURES[name](paper, out) for name in names}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.paper_figures", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--out", required=True)
    parser.add_argument("--figures", help=f"comma-separated, from: {', '.join(FIGURES)}")
    parser.add_argument("--label", action="append", default=[], metavar="OLD=NEW", help="relabel a variant (repeatable)")
    parser.add_argument("--config", help="YAML with figures, labels, baseline")
    parser.add_argument("--baseline", metavar="LABEL")
    args = parser.parse_args(argv)
    try:
        config = read_config(args.config)
        figures = args.figures.split(",") if args.figures else config.get("figures")
        labels = {str(old): str(new) for old, new in (config.get("labels") or {}).items()}
        written = regenerate(args.sweep_dir, args.out, figures, labels, args.baseline or config.get("baseline"),
                             check_label_args(args.label))
    except ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    for name, result in written.items():
        print(f"{name}: skipped ({result.reason})" if isinstance(result, Skipped) else f"{name}: " + ", ".join(str(p) for p in result))


if __name__ == "__main__":
    main()

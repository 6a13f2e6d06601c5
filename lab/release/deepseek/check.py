"""`lab-export --check DIR`: the loader's verdict on a DeepSeek-layout folder, as two gates (docs/releases.md).

It runs `load_deepseek_folder`, the code `lab-generate DIR`, `init_from=hf:DIR` and a run from the folder
run, so PASS on both gates means they accept the folder (docs/releases.md).
"""

from __future__ import annotations

from pathlib import Path

from lab.errors import ConfigError
from lab.release.deepseek.layout import LayoutReport, inspect_layout
from lab.release.deepseek.load import load_deepseek_folder


def report_lines(report: LayoutReport, target: str | None, mtp: str | None, fusion: str) -> list[str]:
    """`target`: None (PASS) or why the main model fails; `mtp`: None (PASS) or why the MTP layers fail."""
    ids = f"{report.n_main}..{report.n_main + report.depth - 1}" if report.depth else "none"
    lines = [f"{report.folder}: {report.family}, {report.n_main} main layers, num_nextn_predict_layers={report.depth} (MTP layer ids {ids})",
             "target-only completeness: " + ("PASS (every main weight loads; none quantised)" if target is None else f"FAIL ({target})")]
    if target is not None:
        return lines + ["MTP completeness: not checked (the main model does not load)"]
    lines += ["MTP completeness: " + ("PASS (transformers' MTP loader reads every MTP weight; the harness's depths take them)"
                                      if mtp is None else f"FAIL ({mtp})"), f"fusion order: {fusion}"]
    return lines + [f"MTP layer {layer}: {report.held[layer]} keys, {report.experts[layer]}" if layer in report.held
                    else f"MTP layer {layer}: 0 keys" for layer in report.mtp_layer_ids]


def check_main(folder: str) -> int:
    """`lab-export --check DIR`: the loader's verdict as the two gates and the details; 1 when a gate fails, else 0."""
    report = inspect_layout(Path(folder))
    try:
        imported = load_deepseek_folder(folder)
    except ConfigError as error:
        print("\n".join(report_lines(report, str(error), None, "")))
        return 1
    print("\n".join(report_lines(report, None, imported.mtp_problem, imported.fusion_line)))
    return 0 if imported.mtp_problem is None else 1

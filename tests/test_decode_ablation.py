"""experiments/decode_ablation.yaml end to end on a tiny sweep: the jobs train, decode at T=1 with their
own heads, and the sweep report draws next-token validation loss against measured speedup from the runs' numbers."""

from __future__ import annotations

import pytest

from lab.report.records import collect_sweep
from lab.report.sweep_figures import loss_speedup_points
from lab.report.table import variants
from tests.cli import TINY, lab_train, read_run


@pytest.mark.slow
def test_tiny_decode_ablation_reports_loss_against_speedup(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = lab_train("-m", "experiment=decode_ablation", *TINY, "head=ntp,parallel,deepseek",
                       "data.seq_len=48", "callbacks.decoding.prompts=2", "callbacks.decoding.prompt_tokens=8",
                       "callbacks.decoding.new_tokens=16", f"hydra.sweep.dir={sweep}", cache_dir=cache_dir, cwd=tmp_path, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = {read_run(path.parent)["manifest"]["head"]: read_run(path.parent)["final_metrics"] for path in sweep.glob("*/run.json")}
    assert set(runs) == {"ntp", "parallel", "deepseek"}
    assert all(runs[h]["decode/speedup"] > 0 and runs[h]["decode/mean_accept_len"] >= 1 for h in ("parallel", "deepseek"))
    assert "decode/speedup" not in runs["ntp"] and runs["ntp"]["decode/mean_accept_len"] == 1.0

    assert (sweep / "figures" / "loss_vs_speedup.png").stat().st_size > 0
    points = {p.variant.head: p for p in loss_speedup_points(variants(collect_sweep(sweep).records))}
    # the report's speedup: the paired median from CPU time when the evaluation was contended, from wall time otherwise
    metric = {head: "decode/speedup_cpu" if runs[head]["decode/contended"] else "decode/speedup" for head in ("parallel", "deepseek")}
    for head in ("parallel", "deepseek"):
        assert (points[head].loss, points[head].speedup) == (runs[head]["val/loss"], runs[head][metric[head]])
    assert (points["ntp"].loss, points["ntp"].speedup, points["ntp"].measured) == (runs["ntp"]["val/loss"], 1.0, False)

    md = (sweep / "report.md").read_text()
    section = md.split("## Next-token loss vs decoding speedup")[1].split("\n## ")[0]
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in section.splitlines() if line.startswith("| head=")}
    for head in ("parallel", "deepseek"):
        assert rows[head][3] == f"{runs[head]['val/loss']:.4f}" and rows[head][4].startswith(f"{runs[head][metric[head]]:.3f} [")
        assert rows[head][4].endswith("(CPU, contended)") == (metric[head] == "decode/speedup_cpu")
    assert rows["ntp"][3:5] == [f"{runs['ntp']['val/loss']:.4f}", "1 (plain decoding)"]

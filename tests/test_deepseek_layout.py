"""`lab-export --check DIR`: the loader's verdict on a DeepSeek-layout folder, its two gates (docs/releases.md) reported apart.
The damaged-release cases (each refused alike by --check and every loader) are tests/test_release_suite.py's."""

from __future__ import annotations

import json
import subprocess

import pytest

from lab.release.deepseek.check import check_main
from lab.release.deepseek.layout import inspect_layout
from lab.release.export import main as lab_export
from tests.cli import SUBPROCESS_TIMEOUT, command_in_process
from tests.deepseek_fixtures import write_deepseek_release

pytestmark = pytest.mark.usefixtures("single_thread")

# DeepseekV3's decoder layer at this size: 5 attention keys (q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj),
# 2 layer norms, 7 MoE keys (gate weight + e_score_correction_bias, fused experts gate_up/down, 3 shared-expert projections)
BLOCK_KEYS = 5 + 2 + 7
OWN_KEYS = 6  # enorm, hnorm, eh_proj, shared_head.norm, shared_head.head, embed_tokens
# n_routed_experts = 4 fused: gate_up_proj [E, 2·moe_intermediate_size, hidden] = [4, 32, 32]
EXPERTS = "4 routed experts, grouped (mlp.experts.gate_up_proj [4, 32, 32])"


@pytest.fixture(scope="module")
def complete(tmp_path_factory):
    return write_deepseek_release(tmp_path_factory.mktemp("ds") / "release", depth=2)


def run_check(folder, capsys) -> tuple[int, list[str]]:
    code = check_main(str(folder))
    return code, capsys.readouterr().out.strip().splitlines()


def test_a_complete_release_passes_both_gates_and_says_its_fusion_order(complete, capsys):
    assert len(list(complete.glob("model-*.safetensors"))) > 1 and (complete / "model.safetensors.index.json").is_file()
    code, lines = run_check(complete, capsys)
    assert code == 0
    assert lines == [f"{complete}: deepseek_v3, 2 main layers, num_nextn_predict_layers=2 (MTP layer ids 2..3)",
                     "target-only completeness: PASS (every main weight loads; none quantised)",
                     "MTP completeness: PASS (transformers' MTP loader reads every MTP weight; the harness's depths take them)",
                     "fusion order: eh — what transformers' MtpLayer concatenates for deepseek_v3 (mtp_hidden_states_first=False)",
                     f"MTP layer 2: {BLOCK_KEYS + OWN_KEYS} keys, {EXPERTS}", f"MTP layer 3: {BLOCK_KEYS + OWN_KEYS} keys, {EXPERTS}"]


def test_a_release_without_layer_n_loads_as_a_target_and_fails_as_a_proposer(tmp_path, capsys):
    """The quantizer-dropped-layer-61 case: the main model is whole, the MTP layer is gone."""
    folder = write_deepseek_release(tmp_path / "r", depth=1, drop_layers=(2,))
    code, lines = run_check(folder, capsys)
    assert code == 1
    assert lines[1].startswith("target-only completeness: PASS")
    assert lines[2] == "MTP completeness: FAIL (MTP layer 2 (model.layers.2.*) is missing entirely)"
    assert lines[4] == "MTP layer 2: 0 keys"


def test_a_missing_main_key_fails_the_target_gate_and_the_mtp_gate_is_not_reached(tmp_path, capsys):
    folder = write_deepseek_release(tmp_path / "r", depth=1, drop=("model.layers.0.mlp.up_proj.weight",))
    code, lines = run_check(folder, capsys)
    assert code == 1 and lines[1:] == [
        f"target-only completeness: FAIL (model.path: {folder}: transformers reports 1 weight(s) missing (would be freshly initialised): "
        "model.layers.0.mlp.up_proj.weight)", "MTP completeness: not checked (the main model does not load)"]


def test_layer_ids_reconcile_with_num_nextn_predict_layers(tmp_path, capsys):
    """Keys of a layer N + D (one more than the config declares) are unexpected to the main model; D = 0 declares no MTP layer."""
    folder = write_deepseek_release(tmp_path / "r", depth=2)
    config = json.loads((folder / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    report = inspect_layout(folder)
    assert report.mtp_layer_ids == [2] and report.held == {2: BLOCK_KEYS + OWN_KEYS, 3: BLOCK_KEYS + OWN_KEYS}
    code, lines = run_check(folder, capsys)
    assert code == 1 and "weight(s) unexpected: model.layers.3." in lines[1]
    config["num_nextn_predict_layers"] = 0
    (folder / "config.json").write_text(json.dumps(config))
    assert inspect_layout(folder).first_mtp_problem.startswith("config.json declares no MTP layers")


def test_cli_check_exit_codes_and_one_line_refusals(complete, tmp_path):
    ok = subprocess.run(["lab-export", "--check", str(complete)], capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert ok.returncode == 0 and "MTP completeness: PASS" in ok.stdout, ok.stderr[-2000:]
    assert ok.stderr.strip() == ""  # transformers' load report is the gate lines, not a table on stderr
    broken = write_deepseek_release(tmp_path / "broken", depth=1, drop_layers=(2,))
    failed = command_in_process("lab-export", "--check", str(broken))  # the real process: the passing check above
    assert failed.returncode == 1 and "MTP completeness: FAIL (MTP layer 2 (model.layers.2.*) is missing entirely)" in failed.stdout
    missing = command_in_process("lab-export", "--check", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [f"error: DIR: no such folder: {tmp_path / 'nowhere'}"]


def test_an_unknown_declared_fusion_order_is_refused(tmp_path, capsys):
    folder = write_deepseek_release(tmp_path / "r", depth=1, config_extra={"mtp_fusion_order": "hidden_first"})
    with pytest.raises(SystemExit) as stop:
        lab_export(["--check", str(folder)])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: mtp_fusion_order: unknown 'hidden_first'; allowed: he ([hidden, embedding]), eh ([embedding, hidden])"]

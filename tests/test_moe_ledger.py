"""The MoE runtime ledger (lab/decode_core/moe_ledger.py) against what one can count by hand on a tiny deepseek_v3 (random weights)."""

from __future__ import annotations

import pytest
import torch

from lab.decode.generate import generate
from lab.decode_core.moe_ledger import MoELedger, fit_expert_term, ledger_line
from lab.nn.moe import RouterTap, router_places
from lab.model.mtp import build_model
from tests.moe_fixtures import MOE_FAMILIES, moe_model_config

pytestmark = pytest.mark.usefixtures("single_thread")

CONFIG = MOE_FAMILIES["deepseek_v3"]
# one routed expert: gate, up [I, d] and down [d, I] in float32
EXPERT_BYTES = 3 * CONFIG["hidden_size"] * CONFIG["moe_intermediate_size"] * 4
PROMPT = torch.tensor([3, 14, 15, 9, 26, 5, 35, 8])


def model(depth: int):
    torch.manual_seed(0)
    return build_model(moe_model_config("deepseek_v3"), {"name": "deepseek", "depth": depth, "block": "native"}).eval()


def test_plain_decoding_touches_top_k_experts_per_step_and_the_prefill_what_a_full_forward_routes():
    net = model(1)
    with MoELedger(net) as ledger:
        out = generate(net, PROMPT, 6)
    report = ledger.report(out.stats)
    rounds = ledger.passes()
    assert [r.verify_rows for r in rounds] == [len(PROMPT)] + [1] * 5
    assert all(r.distinct == {"l1": CONFIG["num_experts_per_tok"]} for r in rounds[1:])  # no draft in plain decoding
    assert report["expert_bytes_verify_mean"] == CONFIG["num_experts_per_tok"] * EXPERT_BYTES == report["expert_bytes_one_row"]
    with RouterTap(router_places(net)) as tap, torch.no_grad():
        net.trunk.hf(PROMPT[None])
    trunk = [r for r in tap.records if r.place.place == "l1"]
    assert rounds[0].distinct["l1"] == len(set(trunk[0].chosen.reshape(-1).tolist()))


@pytest.mark.parametrize("depth", [1, 2])
def test_a_speculative_round_counts_its_verify_rows_drafts_and_depth_costs(depth):
    net = model(depth)
    with MoELedger(net) as ledger:
        out = generate(net, PROMPT, 8, speculative=True)
    report = ledger.report(out.stats)
    rounds = ledger.passes()[1:]
    assert [r.verify_rows for r in rounds] == [1 + m for m in out.stats["proposed_by_round"]]
    for r, m in zip(rounds, out.stats["proposed_by_round"]):
        assert 2 <= r.distinct["l1"] <= min(4, 2 * r.verify_rows)  # top-2 of 4 experts over the verified rows
        assert all(2 <= r.distinct[f"h{d + 1}"] <= 4 for d in range(1, m + 1))  # depth d (place h{d+1}) drafted draft d
    assert report["expert_bytes_verify_mean"] == sum(r.distinct["l1"] for r in rounds) * EXPERT_BYTES / len(rounds)
    assert set(report["mtp_time_s"]) == set(report["mtp_kv_bytes"]) == {f"d{d}" for d in range(1, depth + 1)}
    assert all(v > 0 for v in report["mtp_kv_bytes"].values()) and all(v > 0 for v in report["mtp_time_s"].values())
    assert report["shared_expert_bytes"] == EXPERT_BYTES * (1 + depth)  # one shared expert in l1 and in each depth


def test_a_dense_trunk_under_moe_depths_still_has_rounds_delimited_by_its_target_passes():
    torch.manual_seed(0)
    config = moe_model_config("deepseek_v3", first_k_dense_replace=CONFIG["num_hidden_layers"])  # every trunk layer dense
    net = build_model(config, {"name": "deepseek", "depth": 1, "block": "native"}).eval()  # the depth is still MoE
    with MoELedger(net) as ledger:
        out = generate(net, PROMPT, 8, speculative=True)
    rounds = ledger.passes()
    assert [r.verify_rows for r in rounds] == [len(PROMPT)] + [1 + m for m in out.stats["proposed_by_round"]]
    assert all(not any(place.startswith("l") for place in r.distinct) for r in rounds)  # no trunk router at all
    assert all(2 <= r.distinct["h2"] <= 4 for r in rounds[1:])  # depth 1 drafted (and caught up) before each verification
    assert ledger.report(out.stats)["expert_bytes_draft_mean"] > 0


def test_the_expert_term_is_a_least_squares_fit_checked_by_hand():
    c0, slope = fit_expert_term([1.0, 2.0, 3.0], [3.0, 5.0, 7.0])  # seconds = 1 + 2 · bytes
    assert (c0, slope) == pytest.approx((1.0, 2.0), abs=1e-12)
    assert fit_expert_term([4.0, 4.0], [1.0, 3.0]) == (2.0, 0.0)  # no spread in bytes: no expert term to identify


def test_the_ledger_line_puts_the_cost_model_beside_the_measured_round_cost():
    net = model(1)
    with MoELedger(net) as ledger:
        out = generate(net, PROMPT, 6, speculative=True)
    report = ledger.report(out.stats)
    cost = report["cost"]
    assert cost["predicted_s"] == pytest.approx(cost["mtp_s"] + cost["verify_fixed_s"] + cost["expert_term_s"])
    assert cost["predicted_s"] == pytest.approx(cost["measured_s"], rel=1e-9)  # a least-squares line passes through the means
    line = ledger_line(report)
    assert "distinct experts per round l1" in line and "vs measured" in line and "d1 " in line


def test_lab_generate_prints_the_moe_ledger_of_a_release_with_experts(tmp_path, capsys):
    from lab.decode.cli import main as lab_generate
    from tests.deepseek_fixtures import write_deepseek_release

    folder = write_deepseek_release(tmp_path / "release", depth=1)
    lab_generate([str(folder), "--prompt", "def f1(x):", "--max-new-tokens", "4", "--speculative"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("MoE rounds ") and "distinct experts per round l1 " in lines[-1] and "h2 " in lines[-1]
    lab_generate([str(folder), "--prompt", "def f1(x):", "--max-new-tokens", "4"])  # plain: no ledger line
    assert not any(line.startswith("MoE rounds") for line in capsys.readouterr().err.splitlines())


def test_the_mla_depth_cache_bytes_count_the_latent_and_the_rotary_key_at_their_own_widths():
    net = model(1)
    with MoELedger(net) as ledger:
        out = generate(net, PROMPT, 6, speculative=True)
    kv = ledger.report(out.stats)["mtp_kv_bytes"]["d1"]
    # one MLA layer caches per row its compressed latent (kv_lora_rank = 16) and its rotary key (qk_rope_head_dim = 8), float32;
    # counting the rotary key as wide as the latent (K's width for V) would give 128 bytes a row
    row = (CONFIG["kv_lora_rank"] + CONFIG["qk_rope_head_dim"]) * 4
    rows = len(PROMPT) + out.stats["emitted"] - 2  # tokens 0..n with a successor known, minus the one the depth drafts from
    assert kv == rows * row

"""Router statistics and DeepSeek-V3's balancing tools (lab/nn/moe.py, lab/training/router_balance.py,
lab/callbacks/router_metrics.py): hand-computed loads, bias updates and balance losses on hand-made routings,
then the real CLI (metrics logged per layer and per depth, biases moved, bad input refused in one line)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from lab.callbacks.router_metrics import place_loads, router_metrics
from lab.errors import ConfigError
from lab.labels import chain_masks
from lab.nn.moe import RouterConfig, RouterPlace, RouterTap, load_statistics, router_places
from lab.model.mtp import build_model
from lab.training.router_balance import RouterBalance, build_router_balance, sequence_balance_loss, updated_bias
from tests.cli import TINY, lab_train, lab_train_in_process, read_run
from tests.moe_fixtures import MOE_FAMILIES, moe_model_config
from tests.test_bad_inputs import assert_refused_in_one_line
from tests.test_hf_trunk import packed

pytestmark = pytest.mark.usefixtures("single_thread")


# ----------------------------------------------------------------------------- hand-made routings

def test_load_statistics_of_a_hand_counted_load():
    stats = load_statistics(torch.tensor([2.0, 1.0, 2.0, 1.0], dtype=torch.float64), torch.tensor(3.0))
    assert stats["max_mean"].item() == pytest.approx(2 / 1.5)  # max 2, mean 1.5
    assert stats["cv"].item() == pytest.approx(0.5 / 1.5)  # population std 0.5
    assert stats["top_share"].item() == pytest.approx(2 / 3)  # 2 of the 3 rows went to the top expert


def test_bias_update_moves_each_expert_by_gamma_against_its_load():
    bias = torch.tensor([0.1, 0.0, -0.2, 0.0])
    load = torch.tensor([5.0, 1.0, 2.0, 0.0])  # mean 2: overloaded, under, exactly average, under
    # b + γ·sign: one float32 multiply by ±1 and one add, each correctly rounded (IEEE), so the same bits on any CPU
    torch.testing.assert_close(updated_bias(bias, load, 0.01), torch.tensor([0.09, 0.01, -0.2, 0.01]), rtol=0, atol=1e-9)


def test_sequence_balance_loss_of_hand_made_sequences():
    """E=3, k=1. Sequence 1: two tokens, s = [1, .6, .4] (s' = [.5, .3, .2]) chose 0 and s = [.1, .1, .3]
    (s' = [.2, .2, .6]) chose 2, plus a padding row that chose 1: f = 3/2·[1, 0, 1], P = [.35, .25, .4],
    Σ f P = 1.125. Sequence 2: one token s' = [.2, .3, .5] chose 1: f = [0, 3, 0], Σ f P = 0.9. Sequence 3:
    padding only (no sequence). Mean over the two: 1.0125."""
    affinity = torch.tensor([[[1.0, 0.6, 0.4], [0.1, 0.1, 0.3], [0.9, 0.05, 0.05]],
                             [[0.2, 0.3, 0.5], [0.5, 0.4, 0.1], [0.5, 0.4, 0.1]],
                             [[0.3, 0.3, 0.4], [0.3, 0.3, 0.4], [0.3, 0.3, 0.4]]], dtype=torch.float64)
    chosen = torch.tensor([[[0], [2], [1]], [[1], [0], [0]], [[2], [2], [2]]])
    valid = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    assert sequence_balance_loss(affinity, chosen, valid, top_k=1).item() == pytest.approx(1.0125, abs=1e-12)
    assert sequence_balance_loss(affinity[:1], chosen[:1], valid[:1], top_k=1).item() == pytest.approx(1.125, abs=1e-12)
    # k = 2: sequence 1 chose {0, 1} and {2, 1}: f = 3/(2·2)·[1, 2, 1], Σ f P = .2625 + .375 + .3
    two = torch.tensor([[[0, 1], [2, 1], [1, 0]]])
    assert sequence_balance_loss(affinity[:1], two, valid[:1], top_k=2).item() == pytest.approx(0.9375, abs=1e-12)


def hand_router():
    """A real DeepSeek-V3 router (4 experts, top-2) whose weight is the identity: the logits are its input, so
    feeding logit(p) gives the affinities p exactly."""
    from transformers import AutoConfig
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = AutoConfig.for_model("deepseek_v3", hidden_size=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1)
    router = DeepseekV3TopkRouter(config)
    with torch.no_grad():
        router.weight.copy_(torch.eye(4))
    return router


# Three tokens whose affinities each sum to 2, and a padding row that would route to {0, 1}.
AFFINITIES = torch.tensor([[0.8, 0.6, 0.2, 0.4], [0.1, 0.3, 0.9, 0.7], [0.7, 0.2, 0.6, 0.5], [0.9, 0.8, 0.1, 0.1]], dtype=torch.float64)
ACTIVE = torch.tensor([[True, True, True, False]])


def route(router, tap_places, balance_cfg):
    balance = RouterBalance(balance_cfg, tap_places)
    batch = {"active": ACTIVE, "segment_ids": torch.tensor([[0, 0, 0, -1]])}
    with balance.recording():
        router(torch.logit(AFFINITIES).float()[None])  # [1, 4, 4]
    return balance, batch


def test_balancing_a_hand_made_routing_through_a_real_router():
    """Chosen top-2 per token: {0, 1}, {2, 3}, {0, 2} (the padding row's {0, 1} does not count): loads [2, 1, 2, 1],
    mean 1.5, so b = γ·[−1, +1, −1, +1]. Balance loss: f = 4/(2·3)·[2, 1, 2, 1], P = Σ_t p / (2·3) = [1.6, 1.1, 1.7, 1.6]/6,
    Σ f P = (4·1.6 + 2·1.1 + 4·1.7 + 2·1.6)/18 = 18.6/18; times α = 0.1."""
    router = hand_router()
    places = [RouterPlace("l1", router, 4, 2, "sigmoid")]
    balance, batch = route(router, places, RouterConfig(bias_update_rate=0.25, balance_loss_alpha=0.1))
    loss = balance.loss(batch)
    assert loss.item() == pytest.approx(0.1 * 18.6 / 18, abs=1e-6)
    loss.backward()
    assert router.weight.grad.abs().sum() > 0  # the loss trains the router
    balance.update_bias(batch)
    torch.testing.assert_close(router.e_score_correction_bias, torch.tensor([-0.25, 0.25, -0.25, 0.25]), rtol=0, atol=0)  # 0 ± 0.25: exact
    assert balance.tap.records == [] and not router._forward_hooks  # nothing kept, nothing hooked after the step
    # the bias changes the selection only: token 1 now picks {1, 3} (0.6 + 0.25, 0.4 + 0.25 beat 0.8 − 0.25), and its
    # gating weights are the raw affinities 0.6 and 0.4 (their sum is 1, so normalising keeps them)
    _, weights, chosen = router(torch.logit(AFFINITIES[:1]).float())
    assert sorted(chosen[0].tolist()) == [1, 3]
    scale = router.routed_scaling_factor
    assert sorted(weights[0].tolist()) == pytest.approx([0.4 * scale, 0.6 * scale], abs=1e-6)


# ----------------------------------------------------------------------------- a model's routers

def moe(family: str, head: dict, **router):
    torch.manual_seed(0)
    return build_model({**moe_model_config(family), "router": router or None}, head)


def test_routers_are_found_per_trunk_layer_and_per_depth():
    model = moe("deepseek_v3", {"name": "deepseek", "depth": 2, "block": "native"})
    assert [p.place for p in router_places(model)] == ["l1", "h2", "h3"]  # layer 0 is dense (first_k_dense_replace)
    model = moe("qwen3_moe", {"name": "parallel", "k": 2, "block": "native", "n_layers": 2})
    assert [p.place for p in router_places(model)] == ["l0", "l1", "h1_b0", "h1_b1", "h2_b0", "h2_b1"]
    dense = build_model({"name": "hf", "config": {**MOE_FAMILIES["deepseek_v3"], "model_type": "llama"}}, {"name": "parallel", "k": 2})
    assert router_places(dense) == []


def test_loads_count_real_tokens_in_the_trunk_and_state_rows_in_each_depth():
    """Σ_j tokens per expert = k × the rows that count: active tokens in the trunk, depth d's chain-state rows."""
    model = moe("deepseek_v3", {"name": "deepseek", "depth": 2, "block": "native"}).eval()
    batch = packed()
    places = router_places(model)
    with torch.no_grad(), RouterTap(places) as tap:
        model(batch)
    assert all(not p.module._forward_hooks for p in places)
    loads = place_loads(tap.records, batch)
    active = batch["active"].sum().item()
    states = [chain_masks(batch["active"], batch["segment_ids"], d)[0].sum().item() for d in (1, 2)]
    assert [loads[p].sum().item() for p in ("l1", "h2", "h3")] == [2 * active, 2 * states[0], 2 * states[1]]
    assert states[0] < active  # the depth's rows are fewer: the padding and each document's last row have no state
    metrics = router_metrics("train", loads, {p.place: p.top_k for p in places})
    assert metrics["train/router/top_share/l1"] == loads["l1"].max() / active
    assert set(metrics) >= {f"train/router/tokens/h3/e{j}" for j in range(4)}


def test_model_router_is_typed_once_when_the_model_config_is_built():
    """`model.router` becomes a RouterConfig in HFModelConfig; the model check and the step's balance use that object."""
    model = moe("deepseek_v3", {"name": "deepseek", "depth": 1, "block": "native"}, bias_update_rate=0.001)
    assert model.model_cfg.router == RouterConfig(bias_update_rate=0.001)
    assert build_router_balance(model).cfg is model.model_cfg.router
    assert build_router_balance(moe("deepseek_v3", {"name": "deepseek", "depth": 1, "block": "native"})) is None  # both off


@pytest.mark.parametrize("router, family, field", [
    ({"balance_loss_alpha": 0.01}, "llama", "model.router.balance_loss_alpha"),  # a dense model
    ({"bias_update_rate": 0.001}, "qwen3_moe", "model.router.bias_update_rate"),  # a softmax router without a bias
    ({"bias_update_rate": -1.0}, "deepseek_v3", "model.router.bias_update_rate"),
    ({"gamma": 0.1}, "deepseek_v3", "model.router.gamma"),
])
def test_router_options_that_do_not_fit_are_refused_naming_the_key(router, family, field):
    config = {**MOE_FAMILIES["deepseek_v3"], "model_type": "llama"} if family == "llama" else MOE_FAMILIES[family]
    with pytest.raises(ConfigError) as error:
        build_model({"name": "hf", "config": config, "router": router}, {"name": "ntp"})
    assert error.value.field == field and "\n" not in str(error.value)


@pytest.mark.parametrize("family, extra, field", [
    ("deepseek_v3", {"num_experts_per_tok": 5}, "model.config.num_experts_per_tok"),
    ("deepseek_v3", {"n_routed_experts": 0}, "model.config.n_routed_experts"),
    ("qwen3_moe", {"num_experts": 0}, "model.config.num_experts"),
    ("qwen3_moe", {"num_experts_per_tok": 0}, "model.config.num_experts_per_tok"),
])
def test_expert_counts_that_do_not_fit_are_refused_naming_the_key(family, extra, field):
    with pytest.raises(ConfigError) as error:
        build_model(moe_model_config(family, **extra), {"name": "ntp"})
    assert error.value.field == field and "\n" not in str(error.value)


# ----------------------------------------------------------------------------- the real CLI

NOT_MODEL = [o for o in TINY if not o.startswith(("model.", "trainer.max_steps", "trainer.val_check_interval"))]


def config_override(config: dict) -> str:
    body = ", ".join(f"{key}: {'null' if value is None else value}" for key, value in config.items())
    return "model.config={" + body + "}"


def moe_cli(family: str = "deepseek_v3", **extra) -> list[str]:
    config = {**MOE_FAMILIES[family], "vocab_size": 300, **extra}
    return [*NOT_MODEL, "model=hf", config_override(config), "data.tokenizer=bpe", "data.vocab_size=300"]


def test_a_moe_run_logs_router_metrics_per_layer_and_depth_and_moves_the_biases(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    gamma = 0.01
    out = lab_train(*moe_cli(), "head=deepseek", "head.depth=1", "head.block=native", f"model.router.bias_update_rate={gamma}",
                    "model.router.balance_loss_alpha=0.01", "trainer.max_steps=3", "trainer.val_check_interval=3",
                    f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert read_run(run_dir)["status"] == "ok"
    metrics = pd.read_csv(run_dir / "metrics.csv")
    for stage in ("train", "val"):
        for place in ("l1", "h2"):
            for name in ("max_mean", "cv", "top_share", *(f"tokens/{place}/e{j}" for j in range(4))):
                column = f"{stage}/router/{name}" if "/" in name else f"{stage}/router/{name}/{place}"
                assert metrics[column].notna().any(), column
    assert "train/router/tokens/l0/e0" not in metrics  # the dense first layer has no router
    train = metrics[metrics["train/router/cv/l1"].notna()]
    assert len(train) == 3 and (train["train/router/balance_loss"] > 0).all()
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for key in ("model.trunk.hf.model.layers.1.mlp.gate.e_score_correction_bias", "model.head.depth_modules.0.block.mlp.gate.e_score_correction_bias"):
        steps = state[key] / gamma  # three updates of ±γ or 0 each: an integer in −3..3 per expert
        assert torch.allclose(steps, steps.round(), atol=1e-4) and steps.abs().max() <= 3 and steps.abs().max() >= 1, (key, steps)


@pytest.mark.parametrize("extra, overrides, field", [
    ({"num_experts_per_tok": 5}, [], "model.config.num_experts_per_tok"),  # refused by the pre-flight (config only)
    ({}, ["model.router.bias_update_rate=0.001"], "model.router.bias_update_rate"),  # refused once the model is built
], ids=["top_k_above_experts", "router_option_on_a_dense_model"])
def test_bad_expert_counts_and_router_options_are_refused_in_one_line_leaving_no_folder(tmp_path, cache_dir, extra, overrides, field):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    family = "deepseek_v3"
    args = moe_cli(family, **extra)
    if overrides:  # the dense case: a llama config of the same size
        args = [*NOT_MODEL, "model=hf", config_override({**MOE_FAMILIES[family], "model_type": "llama", "vocab_size": 300}),
                "data.tokenizer=bpe", "data.vocab_size=300"]
    # Refused once the model is built, i.e. after the run folder exists: the CLI removes the folder it made. That
    # case runs in a real process (the folder's removal as a user's command does it); a pre-flight refusal runs in-process.
    run = lab_train if overrides else lab_train_in_process
    result = run(*args, *overrides, "trainer.max_steps=2", cache_dir=cache_dir, cwd=cwd)
    assert_refused_in_one_line(result, field, cwd, set())


# ----------------------------------------------------------------------------- the sweep report's heatmap

def test_the_expert_load_heatmap_puts_trunk_layers_and_depths_side_by_side(tmp_path):
    """Two seeds of one variant: tokens per expert summed over the logged steps, averaged over seeds, over the row's mean."""
    from lab.report.router_figures import expert_load_heatmaps, relative_load
    from lab.report.table import Variant

    def record(l1: list[float], h2: list[float]) -> dict:
        history = {f"val/router/tokens/{place}/e{j}": [(4, value / 2), (8, value / 2)]
                   for place, loads in (("l1", l1), ("h2", h2)) for j, value in enumerate(loads)}
        history["train/router/tokens/l1/e0"] = [(1, 999.0)]  # validation loads win when both are logged
        return {"status": "ok", "head": "deepseek", "k": 2, "history": history}

    records = [record([6, 2, 2, 6], [4, 4, 4, 4]), record([2, 2, 2, 10], [8, 0, 4, 4])]
    places, matrix = relative_load(records)
    assert places == ["l1", "h2"]  # trunk first, then the depth
    expected = [4 / 4, 2 / 4, 2 / 4, 8 / 4, 6 / 4, 2 / 4, 4 / 4, 4 / 4]  # seed means [4, 2, 2, 8] and [6, 2, 4, 4], row means 4
    assert matrix.reshape(-1).tolist() == pytest.approx(expected)
    assert expert_load_heatmaps([Variant("deepseek D=1", records)], tmp_path / "load.png").stat().st_size > 0
    assert expert_load_heatmaps([Variant("ntp", [{"status": "ok", "head": "ntp", "k": 1, "history": {}}])], tmp_path / "none.png") is None

"""experiments/scaling.yaml and the teacherless star-graph variant compose, check and build (nothing is trained)."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from lab.config.preflight import check_single_run
from lab.model.mtp import build_model
from lab.train import CONF_DIR

VARIANTS = ("ntp", "parallel_k4", "identity_phased", "deepseek_d1")


def composed(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=list(overrides))


def parameters(cfg, vocab: int) -> int:
    model_cfg = {**OmegaConf.to_container(cfg.model, resolve=True), "vocab_size": vocab}
    model_cfg.pop("compile")
    return sum(p.numel() for p in build_model(model_cfg, OmegaConf.to_container(cfg.head, resolve=True)).parameters())


def block_weights(cfg) -> int:
    return 12 * cfg.model.d_model ** 2 * cfg.model.n_layers  # attention 4d² + MLP 8d² per block


@pytest.mark.parametrize("preset", ["cpu", "gpu"])
def test_scaling_sizes_grow_and_every_variant_of_a_size_sees_the_same_tokens(preset):
    sizes = []
    for size in ("xs", "s", "m", "l", "xl"):
        configs = [composed("experiment=scaling", f"preset={preset}", f"size={size}", f"variant={v}") for v in VARIANTS]
        tokens = {(c.trainer.max_steps, c.data.batch_size, c.data.seq_len) for c in configs}
        assert len(tokens) == 1, (size, tokens)
        assert [c.head.name for c in configs] == ["ntp", "parallel", "identity", "deepseek"]
        sizes.append(configs[0])
    weights = [block_weights(c) for c in sizes]
    assert weights == sorted(weights) and len(set(weights)) == 5
    if preset == "cpu":  # 0.18 M → 21 M parameters with the byte vocabulary
        assert 0.15e6 < parameters(sizes[0], 256) < 0.25e6 and 15e6 < parameters(sizes[-1], 256) < 25e6
        check_single_run(composed("experiment=scaling", "size=xs", "variant=parallel_k4"))
    else:
        assert abs(parameters(sizes[2], 50304) / 124e6 - 1) < 0.01  # size m is GPT-2 small


def test_the_teacherless_star_graph_variant_switches_the_objective_and_the_data():
    """The preset runs as a sweep: its ntp job notes the shared `weights=phased` (λ = [1] at K = 1, as uniform) and
    runs (a single run of it is refused for that); everything else checks as a single run would."""
    from lab.config.checks import typed_head
    from lab.config.unused import unused_settings

    cfg = composed("experiment=star_graph", "variant=ntp_teacherless")
    assert [s.field for s in unused_settings(cfg, typed_head(cfg))] == ["weights.name"]
    check_single_run(composed("experiment=star_graph", "variant=parallel_k4"))
    assert cfg.objective.teacherless is True and cfg.data.teacherless is True and cfg.head.name == "ntp"
    assert composed("experiment=star_graph", "variant=parallel_k4").objective.teacherless is False

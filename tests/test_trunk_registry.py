"""Every registered trunk family, built from its spec's example (lab/model/trunk_spec.py): it types its config,
trains its trunk and heads, decodes exactly (speculative greedy == plain greedy, a batch == its prompts alone) and
reports the interface decoding reads. tests/test_toy_trunk.py runs `check_family` on a family defined outside lab/."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lab.decode import generate
from lab.errors import ConfigError
from lab.model.mtp import build_model, fill_vocab_size, model_config
from lab.model.trunk_spec import DEFAULT_TRUNK, TRUNK_SPECS, TrunkSpec, register_trunk, trunk_name, trunk_spec, unregister_trunk
from tests.helpers import packed_batch

pytestmark = pytest.mark.usefixtures("single_thread")

import lab.model.trunks  # noqa: E402,F401  (registers the shipped families)


def one_training_step_moves_every_part(model) -> None:
    """A finite loss whose gradient reaches the trunk's blocks, the shared embedding and every horizon's own weights."""
    horizons = model(packed_batch())
    logits = [h.norm(h.hidden) @ h.weight.T for h in horizons]  # [B, S-k, V] each
    loss = sum(F.cross_entropy(z.transpose(1, 2), h.labels, reduction="none")[h.mask].mean() for z, h in zip(logits, horizons))
    assert torch.isfinite(loss)
    loss.backward()
    moved = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().max() > 0}
    assert any(name.startswith("trunk.") for name in moved) and any(name.startswith("head.") for name in moved), sorted(moved)


def check_family(spec: TrunkSpec) -> None:
    """What every family must do, from its spec's example only."""
    example = dict(spec.example)
    assert trunk_name(example) == spec.name and trunk_spec(example) is spec
    cfg = model_config(fill_vocab_size(dict(example), 64))
    assert isinstance(cfg, spec.config) and model_config(cfg) is cfg  # typed once, passed through after
    torch.manual_seed(0)
    model = build_model(fill_vocab_size(dict(example), 64), {"name": "parallel", "k": 2, "n_layers": 1, "compute_match": "none"})
    one_training_step_moves_every_part(model)
    model.eval()
    assert model.trunk.cache_protocol in ("stack", "dynamic") and model.trunk.decoding_refusal() is None
    assert model.trunk.context_length is None or model.trunk.context_length >= 24
    vocab = model.trunk.unembedding.shape[0]
    prompts = [torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n)) for n in (1, 5)]
    for prompt in prompts:
        plain = generate(model, prompt, 16)
        assert generate(model, prompt, 16, speculative=True).tokens == plain.tokens
    same_length = torch.stack([prompts[1], prompts[1].flip(0)])  # [2, 5]: every family batches plain prompts of one length
    batch = generate(model, same_length, 8)
    assert [g.tokens for g in batch] == [generate(model, row, 8).tokens for row in same_length]


@pytest.mark.parametrize("name", sorted(TRUNK_SPECS))
def test_every_registered_trunk_family_trains_and_decodes_exactly(name):
    check_family(TRUNK_SPECS[name])


def test_a_model_mapping_names_its_family_and_an_unknown_one_is_refused():
    assert trunk_name({"d_model": 32}) == DEFAULT_TRUNK and trunk_name({"name": "hf"}) == "hf"
    with pytest.raises(ConfigError, match=r"^model\.name: unknown trunk family 'hff'.*did you mean hf\?\); allowed: gpt, hf$"):
        model_config({"name": "hff"})


def test_the_shipped_families_cannot_be_registered_twice_or_removed():
    with pytest.raises(ConfigError, match=r"^model\.name: 'hf' is registered already"):
        register_trunk(TRUNK_SPECS["hf"])
    with pytest.raises(ConfigError, match=r"^model\.name: 'gpt' is a shipped trunk family"):
        unregister_trunk("gpt")

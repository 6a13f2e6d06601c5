"""`head.block=native`: head blocks that are the HF model's own decoder layer (lab/nn/native_layers.py).

Real transformers models built from config objects (random weights): the blocks' classes and
state keys are the family's, a copied native block computes what the trunk's last layer
computes on the same rows (mask, positions, rotary all as in the trunk), packed documents stay
apart, and cached decoding through the harness's caches equals full forwards.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lab.errors import ConfigError
from lab.decode_core.sampling import TokenChooser
from lab.decode_core.target import CachedModel
from lab.model.heads.deepseek.drafter import DeepSeekChain
from lab.model.mtp import build_model
from lab.nn.native_layers import native_decoder_layer
from tests.head_cases import case, cases
from tests.helpers import float64_throughout
from tests.test_decode_cache import full_horizon_logits, reference_next_token
from tests.test_hf_trunk import FAMILIES, V, packed

pytestmark = pytest.mark.usefixtures("single_thread")

LAYER_CLASSES = {"llama": "LlamaDecoderLayer", "qwen2": "Qwen2DecoderLayer"}
HEADS = {  # every head with transformer blocks of its own (block=native swaps them for the model's layer)
    **cases("parallel", "anticausal", "deepseek"),
    "causal": case("causal", n_layers=2),
}


def native_model(family: str, head: dict, seed: int = 0, **extra):
    torch.manual_seed(seed)
    return build_model({"name": "hf", "config": FAMILIES[family]}, {**head, "block": "native", **extra})


def head_layers(model) -> list[tuple[str, torch.nn.Module]]:
    """(state-key prefix inside the head, layer) of every head block, in build order."""
    if hasattr(model.head, "depth_modules"):
        return [(f"depth_modules.{d}.block", m.block) for d, m in enumerate(model.head.depth_modules)]
    return [(f"stacks.{i}.blocks.{j}", b) for i, s in enumerate(model.head.stacks) for j, b in enumerate(s.blocks)]


@pytest.mark.parametrize("family", list(LAYER_CLASSES))
@pytest.mark.parametrize("head", ["causal", "deepseek"])
def test_native_head_blocks_are_the_family_decoder_layer_with_fresh_indices(family, head):
    model = native_model(family, HEADS[head])
    last = model.trunk.blocks[-1]
    n_trunk = len(model.trunk.blocks)
    layers = head_layers(model)
    assert type(last).__name__ == LAYER_CLASSES[family]
    assert all(type(layer) is type(last) for _, layer in layers)
    assert [layer.self_attn.layer_idx for _, layer in layers] == list(range(n_trunk, n_trunk + len(layers)))
    expected = {f"{prefix}.{key}" for prefix, _ in layers for key in last.state_dict()}
    assert {key for key in model.head.state_dict() if "block" in key} == expected
    # a fresh layer starts from the family's own initialisation (std = initializer_range), not torch's default
    alone = native_decoder_layer(model.hf_model.config, n_trunk + 5)  # the one construction, from the config alone
    assert type(alone) is type(last) and alone.self_attn.layer_idx == n_trunk + 5 and alone.state_dict().keys() == last.state_dict().keys()
    q = layers[0][1].self_attn.q_proj.weight
    assert abs(q.std().item() - model.hf_model.config.initializer_range) < 0.3 * model.hf_model.config.initializer_range


@pytest.mark.parametrize("family", list(LAYER_CLASSES))
def test_a_copied_native_block_on_the_last_layers_input_gives_the_trunk_output(family):
    """Stack 2 of a copy_last parallel head is the last trunk layer: fed that layer's input (packed rows, their
    document mask and restarting positions) it returns the trunk's pre-norm output."""
    model = native_model(family, {"name": "parallel", "k": 2}, init="copy_last").eval()
    batch = packed()
    ctx = model.trunk.attention_context(batch["segment_ids"], batch["position_ids"], batch["active"])
    with torch.no_grad():
        pre_norm = model.trunk(batch["tokens"], ctx)  # [B, S, d]
        states = model.hf_model.base_model(input_ids=batch["tokens"], attention_mask=model.trunk.hf_mask(ctx.mask),
                                           position_ids=batch["position_ids"], use_cache=False, output_hidden_states=True).hidden_states
        out = model.head.stacks[1](states[-2], ctx)  # [B, S, d]: the last layer's input through the copy
        torch.testing.assert_close(out, pre_norm, atol=1e-5, rtol=0)
        # control: the block does read the positions (rotary is relative, so stretch the distances)
        ctx.position_ids = 2 * batch["position_ids"]
        assert (model.head.stacks[1](states[-2], ctx) - pre_norm).abs().max() > 1e-4


def horizon_logits(model, batch) -> list[torch.Tensor]:
    with torch.no_grad():
        return [F.linear(h.norm(h.hidden), h.weight) for h in model(batch)]  # k × [B, S-k, V]


def assert_documents_stay_apart(model, atol: float, moved_above: float, still=()) -> None:
    """Changing a token of document A (row 0, tokens 0..5) moves A's later rows of every horizon (above `moved_above`,
    except the horizons in `still`, whose rows A has none of after the change) and leaves document B (6..10) and
    the other row as they were (within `atol`)."""
    batch = packed()  # row 0: document A = tokens 0..5, document B = 6..10, one pad
    changed = batch["tokens"].clone()
    changed[0, 2] = changed[0, 2] % (V - 1) + 1
    before, after = horizon_logits(model, batch), horizon_logits(model, {**batch, "tokens": changed})
    for k, (a, b) in enumerate(zip(before, after), start=1):
        torch.testing.assert_close(b[0, 6:], a[0, 6:], atol=atol, rtol=0, msg=f"horizon {k}: document B moved")
        torch.testing.assert_close(b[1], a[1], atol=atol, rtol=0)
        assert (b[0, 2:6 - k] - a[0, 2:6 - k]).abs().max() > moved_above or k in still, f"horizon {k}: document A did not move"


@pytest.mark.parametrize("family,head", [("llama", "parallel"), ("llama", "causal"), ("llama", "anticausal"),
                                         ("llama", "deepseek"), ("qwen2", "parallel"), ("qwen2", "deepseek")])
def test_changing_one_document_leaves_the_other_documents_head_logits_unchanged(family, head):
    assert_documents_stay_apart(native_model(family, HEADS[head]).eval(), atol=1e-6, moved_above=1e-4, still=(3,))


def one_document(tokens: list[int]) -> dict:
    from tests.helpers import make_batch

    return make_batch([tokens], [[0] * len(tokens)])


@pytest.mark.parametrize("head", ["parallel", "causal", "anticausal"])
def test_cached_native_steps_equal_full_forwards_with_rollbacks(head):
    """Each cached target pass (provisional rows, then a commit or a discard) gives the logits of a no-cache
    forward over the same sequence, for the next token and every draft horizon (float64)."""
    assert_cached_steps_equal_full_forwards(native_model("llama", HEADS[head]).double().eval())


def assert_cached_steps_equal_full_forwards(model) -> None:
    """Seven cached passes with commits and rollbacks (tests/test_moe_models.py runs it on MoE trunks).

    1e-9 holds on any CPU because the model runs in float64 end to end (`float64_throughout`: the families'
    float32 RMSNorm, rotary and router pieces too); the two paths then differ by float64 rounding, ~1e-16."""
    assert next(model.parameters()).dtype == torch.float64
    g = torch.Generator().manual_seed(1)
    state = CachedModel(model)
    committed: list[int] = []
    chunk = torch.randint(0, V, (6,), generator=g).tolist()
    with torch.no_grad(), float64_throughout():
        for step in range(7):
            result = state.forward(chunk)
            sequence = committed + chunk
            torch.testing.assert_close(result.logits, reference_next_token(model, sequence)[len(committed):], atol=1e-9, rtol=0)
            full = full_horizon_logits(model, sequence)
            for k, rows in enumerate(result.more_horizons, start=2):
                upto = len(sequence) - k  # rows whose slot t+k lies inside the sequence
                if upto > len(committed):
                    got = model.horizon_logits(k, rows[0])[: upto - len(committed)]  # [n', V]
                    torch.testing.assert_close(got, full[k - 1][len(committed):upto], atol=1e-9, rtol=0, msg=f"step {step} horizon {k}")
            if step % 3 == 1:
                state.caches.discard()  # rollback: the whole branch goes
            else:
                keep = max(1, len(chunk) - step % 2)
                state.caches.commit(keep)
                committed += chunk[:keep]
            assert all(cache.committed == len(committed) for cache in state.caches.caches.values())
            chunk = torch.randint(0, V, (1 + step % 3,), generator=g).tolist()


def test_native_deepseek_draft_steps_equal_teacher_forced_forwards():
    assert_draft_chain_equals_teacher_forced_forwards(native_model("llama", HEADS["deepseek"]).double().eval())


def assert_draft_chain_equals_teacher_forced_forwards(model) -> None:
    """Each draft step of a D=2 chain (its depth modules' own caches, rounds of 1..3 kept rows) gives the logits of
    that depth in a no-cache forward over the same path (tests/test_moe_models.py runs it with MoE depth modules).
    Float64 end to end, as above, so that 1e-9 holds on any CPU."""
    assert next(model.parameters()).dtype == torch.float64
    state = CachedModel(model)
    chain = DeepSeekChain(state, draft_steps=2)
    greedy = TokenChooser(0.0, None, None)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, V, (5,), generator=g).tolist()
    with torch.no_grad(), float64_throughout():
        chain.after_verify(state.forward(tokens), list(range(len(tokens))))
        state.commit(len(tokens))
        for round_ in range(4):
            frontier = int(torch.randint(0, V, (), generator=g))
            drafts = chain.draft_chain(tokens, frontier, 2, greedy)[0]
            full = full_horizon_logits(model, tokens + [frontier] + drafts)
            for step in (1, 2):  # depth `step` at row n-1, its teachers the path's tokens
                torch.testing.assert_close(chain.draft_logits[step - 1], full[step][len(tokens) - 1], atol=1e-9, rtol=0)
            kept = 1 + round_ % 3
            chain.after_verify(state.forward([frontier, *drafts][:kept]), list(range(kept)))
            state.commit(kept)
            tokens += [frontier, *drafts][:kept]


@pytest.mark.parametrize("family,head", [("llama", "parallel"), ("llama", "deepseek"), ("qwen2", "causal")])
def test_copy_last_makes_every_head_block_a_bitwise_copy_of_the_last_trunk_layer(family, head):
    model = native_model(family, {**HEADS[head], "n_layers": 2} if head != "deepseek" else HEADS[head], init="copy_last")
    reference = model.trunk.blocks[-1].state_dict()
    trunk_parameters = {id(p) for p in model.trunk.parameters()}
    layers = head_layers(model)
    assert len(layers) >= 2
    for _, layer in layers:
        state = layer.state_dict()
        assert state.keys() == reference.keys() and all(torch.equal(state[key], reference[key]) for key in reference)
        assert not any(id(p) in trunk_parameters for p in layer.parameters())  # copies, not the trunk's Parameters
    assert len({id(p) for _, layer in layers for p in layer.parameters()}) == sum(len(list(layer.parameters())) for _, layer in layers)
    with torch.no_grad():  # a copy moves on its own
        layers[0][1].self_attn.q_proj.weight.add_(1.0)
    assert torch.equal(layers[1][1].self_attn.q_proj.weight, reference["self_attn.q_proj.weight"])
    assert torch.equal(model.trunk.blocks[-1].self_attn.q_proj.weight, reference["self_attn.q_proj.weight"])


@pytest.mark.parametrize("model_cfg,head,field", [
    ({"vocab_size": 13, "d_model": 16, "n_heads": 2, "n_layers": 4}, {"name": "parallel", "k": 2, "block": "native"}, "head.block"),
    ({"name": "hf", "config": FAMILIES["llama"]}, {"name": "parallel", "k": 2, "init": "copy_last"}, "head.init"),
    ({"name": "hf", "config": FAMILIES["llama"]}, {"name": "parallel", "k": 2, "block": "nope"}, "head.block"),
])
def test_native_block_options_that_do_not_fit_are_refused_naming_the_field(model_cfg, head, field):
    with pytest.raises(ConfigError) as error:
        build_model(model_cfg, head)
    assert error.value.field == field and "\n" not in str(error.value)


def test_native_head_blocks_take_the_trunks_dtype():
    """model.dtype=bfloat16: the head's decoder layers are built in the trunk's precision and run on its rows."""
    torch.manual_seed(0)
    model = build_model({"name": "hf", "config": FAMILIES["llama"], "dtype": "bfloat16"}, {"name": "parallel", "k": 2, "block": "native"})
    assert {p.dtype for _, layer in head_layers(model) for p in layer.parameters()} == {torch.bfloat16}
    horizons = model(packed())
    assert horizons[1].hidden.dtype == torch.bfloat16 and torch.isfinite(horizons[1].hidden.float()).all()

"""MoE and MLA trunks (model=hf) and MoE depth modules (`head.block=native`), on tiny transformers configs.

Every head trains on each family; on deepseek_v3 a native depth module is the family's MoE decoder layer (as
the release's layer 61 is); packed documents stay apart through the routed experts; cached decoding equals
full forwards; speculative greedy equals plain greedy; speculative sampling keeps the exact law (enumeration).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lab.decode import generate
from lab.model.mtp import build_model
from tests.head_cases import case, cases
from tests.moe_fixtures import MOE_BLOCKS, MOE_FAMILIES, V, moe_model_config
from tests.helpers import float64_throughout, horizon_sums
from tests.test_hf_trunk import packed
from tests.test_native_blocks import (assert_cached_steps_equal_full_forwards, assert_documents_stay_apart,
                                      assert_draft_chain_equals_teacher_forced_forwards)
from tests.test_speculative import assert_greedy_speculative_equals_plain, fit_counting

pytestmark = pytest.mark.usefixtures("single_thread")

HEADS = {  # every registered head, and native-block variants
    **cases(),
    "deepseek_native": case("deepseek", block="native"),
    "parallel_native": case("parallel", block="native"),
}


def moe(family: str, head: str, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_model(moe_model_config(family, **overrides), HEADS[head])


def moe64(family: str, head: str, seed: int = 0):
    """A float64 copy for the exactness tests: transformers' default expert kernel (grouped_mm) takes
    float32/bfloat16/float16 only, so these run the experts through its eager loop. The glm4_moe/deepseek_v3
    routers still cast to float32 inside (as do the families' RMSNorms and rotary): a test comparing two code
    paths runs under `float64_throughout` (tests/helpers.py), else its router matmuls round by the CPU's kernels."""
    return moe(family, head, seed, experts_implementation="eager").double().eval()


@pytest.mark.parametrize("family", list(MOE_FAMILIES))
@pytest.mark.parametrize("head", list(HEADS))
def test_every_head_takes_a_training_step_on_a_moe_trunk(family, head):
    """One Adam step lowers the loss sum of every horizon on a fixed batch (the whole graph, experts included, is live)."""
    model = moe(family, head)
    batch = packed()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(2):
        sums = torch.stack(horizon_sums(model(batch)))  # [K]
        optimizer.zero_grad()
        sums.sum().backward()
        losses.append(sums.detach())
        optimizer.step()
    assert (losses[1] < losses[0]).all(), (losses[0], losses[1])
    experts = [p for n, p in model.named_parameters() if "experts" in n]
    assert experts and any(p.grad is not None and p.grad.abs().sum() > 0 for p in experts)


@pytest.mark.parametrize("family", list(MOE_FAMILIES))
def test_a_native_depth_module_is_the_familys_moe_decoder_layer(family):
    model = moe(family, "deepseek_native")
    n_trunk = len(model.trunk.blocks)
    blocks = [m.block for m in model.head.depth_modules]
    assert all(type(b) is type(model.trunk.blocks[-1]) for b in blocks)
    assert [type(b.mlp).__name__ for b in blocks] == [MOE_BLOCKS[family]] * 2  # routed experts, not the dense MLP
    assert [b.self_attn.layer_idx for b in blocks] == [n_trunk, n_trunk + 1]
    if family == "deepseek_v3":
        assert type(model.trunk.blocks[0].mlp).__name__ == "DeepseekV3MLP"  # first_k_dense_replace=1 kept in the trunk
        assert blocks[0].self_attn.kv_a_proj_with_mqa.out_features == 16 + 8  # MLA: latent + rotary key


def test_a_native_depth_is_an_moe_layer_even_where_every_trunk_layer_is_dense():
    """first_k_dense_replace above the trunk's depth: transformers still builds its MTP layers with experts
    (get_mtp_config sets it to 0), and so does head.block=native."""
    model = moe("deepseek_v3", "deepseek_native", first_k_dense_replace=5)
    assert {type(b.mlp).__name__ for b in model.trunk.blocks} == {"DeepseekV3MLP"}
    assert [type(m.block.mlp).__name__ for m in model.head.depth_modules] == ["DeepseekV3MoE"] * 2
    mtp = model.hf_model.config.get_mtp_config()  # what transformers builds its own MTP layers from
    assert mtp.first_k_dense_replace == 0


@pytest.mark.parametrize("family", list(MOE_FAMILIES))
@pytest.mark.parametrize("head", ["deepseek_native", "parallel_native"])
def test_changing_one_document_leaves_the_others_outputs_unchanged_through_the_experts(family, head):
    # 1e-12 with the routers' float32 matmuls left in: both forwards have the same shapes, so every kernel (the
    # float32 ones too) is the same in both, and document B's rows get the same inputs (bitwise) on any CPU.
    assert_documents_stay_apart(moe64(family, head), atol=1e-12, moved_above=1e-6)


class Float32Ops(TorchDispatchMode):
    """Records the ops that produce a float32 tensor."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(o, torch.Tensor) and o.dtype == torch.float32 for o in (out if isinstance(out, (tuple, list)) else [out])):
            self.seen.add(str(func))
        return out


@pytest.mark.parametrize("family", list(MOE_FAMILIES))
def test_float64_throughout_leaves_no_float32_op_in_a_float64_moe_model(family):
    """What the exactness tests below rely on: under tests/helpers.py's float64_throughout no op of a full forward or
    a cached pass of a float64 model makes float32 (transformers' RMSNorm, rotary and router casts, lab's rotary);
    without it some do (the router's float32 matmul among them for glm4_moe and deepseek_v3)."""
    from lab.decode_core.target import CachedModel

    model = moe64(family, "parallel_native")
    for mode, expected in ((float64_throughout, False), (contextlib.nullcontext, True)):
        ops = Float32Ops()
        with torch.no_grad(), mode(), ops:
            model(packed())
            CachedModel(model).forward([1, 2, 3])
        assert bool(ops.seen) is expected, (family, sorted(ops.seen))
        assert family == "qwen3_moe" or expected is ("aten.mm.default" in ops.seen)


@pytest.mark.parametrize("family", list(MOE_FAMILIES))
def test_cached_moe_steps_equal_full_forwards_with_rollbacks(family):
    """Cached target passes (provisional rows, then commit or discard) give the no-cache logits of the next token
    and of every draft horizon: the MLA trunk's and the MoE head blocks' caches included (float64)."""
    assert_cached_steps_equal_full_forwards(moe64(family, "parallel_native"))


def test_moe_deepseek_draft_steps_equal_teacher_forced_forwards():
    """The draft chain through MoE depth modules (their own MLA caches) gives each depth's full-forward logits."""
    assert_draft_chain_equals_teacher_forced_forwards(moe64("deepseek_v3", "deepseek_native"))


@pytest.mark.parametrize("family,head,steps", [("deepseek_v3", "deepseek_native", [1, None]),
                                               ("glm4_moe", "deepseek_native", [2]), ("qwen3_moe", "parallel_native", [None])])
def test_speculative_greedy_equals_plain_greedy_on_moe(family, head, steps):
    model = fit_counting(moe64(family, head), vocab=V)
    assert_greedy_speculative_equals_plain(model, steps, f"{family}/{head}")


@pytest.mark.parametrize("steps", [None, pytest.param(1, marks=pytest.mark.slow)])
def test_speculative_sampling_keeps_the_exact_law_with_moe_depth_modules(steps):
    """Every draw enumerated (tests/test_decode_law.py): speculative sampling through MoE depth modules on an MLA
    MoE trunk has exactly the law of plain sampling from no-cache full forwards (1e-12)."""
    from tests.test_decode_law import assert_same_law, enumerated_law
    from tests.test_speculative import exact_law

    vocab, prompt = 3, [2, 0, 1, 1]
    torch.manual_seed(3)
    config = {**MOE_FAMILIES["deepseek_v3"], "vocab_size": vocab, "hidden_size": 16, "moe_intermediate_size": 8,
              "experts_implementation": "eager"}
    model = build_model({"name": "hf", "config": config}, HEADS["deepseek_native"]).double().eval()
    # Both laws are computed in float64 end to end (`exact_law` and `enumerated_law` run under float64_throughout):
    # with the router's float32 matmul left in, cached passes and full forwards would differ by the CPU's kernels.
    expected = exact_law(model, prompt, 3, 1.0, vocab)
    law, runs, rejections = enumerated_law(
        lambda draws: generate(model, torch.tensor(prompt), 3, temperature=1.0, speculative=True, draft_steps=steps, draws=draws))
    assert rejections > 0 and runs > vocab**3  # drafts were proposed and the residual branch ran
    assert_same_law(law, expected)

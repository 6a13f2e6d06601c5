"""The ledger's time split (Generation.stats["time_split_s"]): target forward, draft blocks, outside, for every head.

Perturbation tests: a known delay injected into the draft blocks (or the target's trunk) must
show up in that share of the split and not in another one.
"""

from __future__ import annotations

import time

import pytest
import torch

from lab.decode import generate
from lab.model.heads.deepseek.drafter import DeepSeekChain
from tests.helpers import build_model

pytestmark = pytest.mark.usefixtures("single_thread")

DELAY = 0.03  # large against a round's own work, which a loaded machine can stretch several-fold
HEADS = {
    "parallel": ("parallel", 3, {}),
    "causal": ("causal", 3, {}),
    "linear": ("linear", 3, {}),
    "medusa": ("medusa", 3, {}),
    "deepseek_d1": ("deepseek", 2, {"depth": 1}),
    "deepseek_d2": ("deepseek", 3, {"depth": 2}),
}


def slowed(function, calls: list):
    def run(*args, **kwargs):
        calls.append(1)
        time.sleep(DELAY)
        return function(*args, **kwargs)

    return run


def delay_draft_blocks(model) -> list:
    """Every draft-block forward sleeps DELAY first; returns the list that counts them."""
    calls, head = [], model.head
    if head.drafter is DeepSeekChain:  # DeepSeek: the depth modules run inside the proposal
        chain_module = head.chain_module
        head.chain_module = lambda step: slowed(chain_module(step), calls)
    else:  # independent heads: one batched forward of the draft stacks after each target pass
        drafter = head.decode_drafter
        head.decode_drafter = lambda: slowed(drafter(), calls)
    return calls


@pytest.mark.parametrize("trunk", ["gpt", "hf"])
@pytest.mark.parametrize("head", sorted(HEADS))
def test_draft_block_time_is_attributed_to_the_draft_blocks(head, trunk):
    name, k, extra = HEADS[head]
    model = build_model(name, k, trunk=trunk, **extra).double().eval()
    prompt = torch.tensor([1, 2, 3, 4, 5])
    before = generate(model, prompt, 12, speculative=True).stats["time_split_s"]
    calls = delay_draft_blocks(model)
    stats = generate(model, prompt, 12, speculative=True).stats
    split, injected = stats["time_split_s"], len(calls) * DELAY
    assert calls and split["draft_blocks"] >= injected
    assert split["outside_blocks"] - before["outside_blocks"] < 0.5 * injected  # the delay did not leak into "outside"
    assert stats["draft_time_s"] >= split["draft_blocks"] - stats["prefill_time_s"]


def test_target_time_is_attributed_to_the_target_forward():
    model = build_model("parallel", 3).double().eval()
    prompt = torch.tensor([1, 2, 3, 4, 5])
    before = generate(model, prompt, 12, speculative=True).stats["time_split_s"]
    model.trunk.register_forward_hook(lambda *args: time.sleep(DELAY))
    stats = generate(model, prompt, 12, speculative=True).stats
    split, injected = stats["time_split_s"], (stats["target_forwards"] - 1) * DELAY  # the prefill's pass is not a round's
    assert split["target_forward"] >= injected
    assert split["outside_blocks"] - before["outside_blocks"] < 0.5 * injected and split["draft_blocks"] - before["draft_blocks"] < 0.5 * injected
    assert stats["verify_time_s"] >= split["target_forward"]

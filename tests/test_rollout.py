"""The DeepSeek chain trained as it serves (head.rollout=self, lab/model/heads/deepseek/head.py).

Equivalences: one self-fed step is teacher forcing exactly; s steps of one module on the data tokens
are DeepSeek with depth s and one shared module; a perturbation shows which tokens each step reads
(drafted: never the data token t+j at step j ≥ 2); decoding a self-fed chain is exact and drafts s tokens.
"""

from __future__ import annotations

import pytest
import torch

from lab.decode import generate
from tests.cli import TINY, lab_train
from tests.helpers import build_model, loss_and_grads, packed_batch

pytestmark = pytest.mark.usefixtures("single_thread")


def deepseek(**head):
    return build_model("deepseek", None, seed=4, depth=head.pop("depth", 1), **head)


@pytest.mark.parametrize("tokens", ["drafted", "data"])
def test_one_self_fed_step_is_teacher_forcing_exactly(tokens):
    batch = packed_batch(seed=2)
    loss_teacher, grads_teacher = loss_and_grads(deepseek(), batch)
    loss_self, grads_self = loss_and_grads(deepseek(rollout="self", rollout_steps=1, rollout_tokens=tokens), batch)
    # Bitwise on any CPU: both run the same forward (lab/model/heads/deepseek/head.py) on the same shapes, so the same kernels.
    assert torch.equal(loss_teacher, loss_self)
    assert grads_teacher.keys() == grads_self.keys() and all(torch.equal(grads_teacher[n], grads_self[n]) for n in grads_teacher)


def test_three_steps_of_one_module_on_the_data_tokens_are_a_shared_depth_3_chain():
    batch = packed_batch(seed=3)
    loss_shared, grads_shared = loss_and_grads(deepseek(depth=3, share_depth_weights=True), batch)
    loss_self, grads_self = loss_and_grads(deepseek(rollout="self", rollout_steps=3, rollout_tokens="data"), batch)
    assert torch.equal(loss_shared, loss_self)  # bitwise: the same forward on the same shapes, as above
    assert all(torch.equal(grads_shared[n], grads_self[n]) for n in grads_shared)


@pytest.mark.parametrize("tokens, reads_data_token", [("drafted", False), ("data", True)])
def test_a_drafted_step_never_reads_the_data_token_it_drafted(tokens, reads_data_token):
    """Horizon 3 at row t runs step 2, which reads token t+2: a drafted chain reads step 1's guess instead, so changing
    the data token t+2 leaves its row unchanged; a data chain's row changes."""
    model = deepseek(rollout="self", rollout_steps=2, rollout_tokens=tokens)
    batch = packed_batch(seed=5)
    changed = {**batch, "tokens": batch["tokens"].clone()}
    changed["tokens"][0, 4] = (changed["tokens"][0, 4] + 1) % 30 + 1  # data token 4, inside row 0's first document
    with torch.no_grad():
        before, after = model(batch)[2].hidden, model(changed)[2].hidden  # [B, S-3, d]: horizon 3 rows t
    t = 2  # step 2 at row 2 reads token t+2 = 4; every input at rows ≤ 2 of steps 1 and 2 reads tokens ≤ 3
    assert torch.equal(before[0, :t], after[0, :t])
    assert torch.equal(before[0, t], after[0, t]) is not reads_data_token


def test_a_self_fed_chain_decodes_exactly_and_drafts_its_steps():
    model = deepseek(rollout="self", rollout_steps=3).eval()
    prompt = torch.tensor([3, 5, 7, 9, 11])
    plain = generate(model, prompt, 20)
    speculative = generate(model, prompt, 20, speculative=True)
    assert speculative.tokens == plain.tokens
    assert len(speculative.stats["proposed_by_position"]) == 3 and model.k == 4


@pytest.mark.parametrize("overrides, message", [
    (["head=parallel", "head.k=2", "+head.rollout=self"], "head.rollout: not an option"),
    (["head=deepseek", "head.depth=2", "head.rollout=self", "head.rollout_steps=1"], "head.rollout_steps: must be an integer ≥ head.depth=2"),
    (["head=deepseek", "head.rollout_steps=3"], "head.rollout_steps: sets the steps of a self-fed rollout: it needs head.rollout=self"),
    (["head=deepseek", "head.compute_match=none", "head.rollout=self", "head.rollout_steps=40"],
     "head.rollout_steps: must be < data.seq_len − 1 = 31"),
    (["head=deepseek", "head.rollout=sometimes"], "head.rollout: unknown 'sometimes'; allowed: teacher, self"),
])
def test_bad_rollout_settings_are_one_line_before_the_run_folder(tmp_path, cache_dir, overrides, message):
    result = lab_train(*TINY, *overrides, f"hydra.run.dir={tmp_path / 'run'}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    assert len([line for line in result.stderr.splitlines() if line.startswith("error")]) == 1
    assert not (tmp_path / "run").exists()

"""The draft vocabulary (`head.draft_vocab`, lab/nn/draft_vocab.py): horizons ≥ 2 over N frequent ids.

Oracles: hand-counted ids on a tiny corpus with a tie; a hand-built label remap; the restricted loss
against a cross-entropy computed by hand on the sliced logits; the coverage metric counted by hand;
greedy speculative == plain greedy and the exact sampling law by enumeration (V = 8, N = 3) on the
harness GPT and a tiny transformers Llama, chains and trees; a cached step == a live step.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import default_collate

from lab.decode import generate
from lab.errors import ConfigError
from lab.nn.draft_vocab import index_of, most_frequent_ids, restrict_horizon, training_token_counts
from lab.horizon import Horizon
from lab.model.mtp import build_model
from lab.objective.objective import Objective
from lab.objective.weights import Progress
from lab.training.step import train_step
from tests.cli import TINY, lab_train, read_run
from tests.helpers import hf_llama_config, make_batch
from tests.test_decode_law import assert_same_law, enumerated_law
from tests.test_hidden_cache import GradientsOnly
from tests.test_speculative import exact_law

pytestmark = pytest.mark.usefixtures("single_thread")

V, N = 8, 3
PROMPT = [2, 0, 1, 5]
DRAFT_IDS = torch.tensor([5, 1, 2])  # an arbitrary set (not 0..N-1), so index != id everywhere


def test_ids_are_the_most_frequent_training_tokens_ties_to_the_smaller_id():
    # counts: 3 -> 4, 7 -> 2, 1 -> 2, 5 -> 2, 0 -> 1 (padding excluded), 2 -> 0
    rows = [{"tokens": torch.tensor([3, 7, 3, 1, 0, 0]), "active": torch.tensor([1, 1, 1, 1, 0, 0])},
            {"tokens": torch.tensor([5, 3, 1, 7, 5, 3]), "active": torch.tensor([1, 1, 1, 1, 1, 1])},
            {"tokens": torch.tensor([0, 4, 4, 4, 4, 4]), "active": torch.tensor([1, 0, 0, 0, 0, 0])}]
    counts = training_token_counts(rows, V)
    assert counts.tolist() == [1, 2, 0, 4, 0, 2, 0, 2]
    assert most_frequent_ids(counts, 3).tolist() == [3, 1, 5]  # 1, 5 and 7 tie at 2: the smaller ids first
    assert most_frequent_ids(counts, 5).tolist() == [3, 1, 5, 7, 0]


def test_labels_are_remapped_and_targets_outside_the_set_are_not_supervised():
    hidden = torch.zeros(1, 5, 4)
    weight = torch.arange(V * 4, dtype=torch.float32).reshape(V, 4)
    horizon = Horizon(k=2, hidden=hidden, labels=torch.tensor([[5, 0, 2, 1, 7]]), mask=torch.tensor([[True, True, True, False, True]]),
                      norm=None, weight=weight)
    out = restrict_horizon(horizon, DRAFT_IDS, index_of(DRAFT_IDS, V))
    assert out.mask.tolist() == [[True, False, True, False, False]]  # 0 and 7 are outside; row 3 was never supervised
    assert out.labels[out.mask].tolist() == [0, 2]  # 5 -> index 0, 2 -> index 2
    assert torch.equal(out.weight, weight[[5, 1, 2]])
    assert out.draft_coverage.tolist() == [2, 4]
    assert index_of(DRAFT_IDS, V).tolist() == [-100, 1, 2, -100, -100, 0, -100, -100]


def tiny(head: dict, trunk: str = "gpt", seed: int = 3, ids=DRAFT_IDS):
    torch.manual_seed(seed)
    model_cfg = {"name": "hf", "config": hf_llama_config(vocab=V, d_model=8)} if trunk == "hf" else {"vocab_size": V, "d_model": 8, "n_layers": 2, "n_heads": 2}
    model = build_model(model_cfg, {"compute_match": "none", **head, "draft_vocab": None if ids is None else len(ids)})
    if ids is not None:
        model.set_draft_ids(ids)
    return model.double().eval()


def test_the_restricted_loss_is_cross_entropy_over_the_sliced_logits_by_hand():
    model = tiny({"name": "parallel", "k": 3})
    tokens = torch.tensor([[1, 5, 2, 0, 5, 1, 7, 2, 2, 5]])
    batch = make_batch(tokens, torch.zeros_like(tokens))
    horizons = model(batch)
    assert horizons[0].weight.shape[0] == V and horizons[0].vocab_ids is None  # the next-token path keeps every id
    for h in horizons[1:]:
        logits = F.linear(h.norm(h.hidden), model.trunk.unembedding[DRAFT_IDS])  # [1, S-k, N]
        position = {5: 0, 1: 1, 2: 2}
        expected, counted = 0.0, 0
        for t in range(tokens.shape[1] - h.k):
            target = int(tokens[0, t + h.k])
            if target in position:
                expected -= torch.log_softmax(logits[0, t], -1)[position[target]].item()
                counted += 1
        got = F.cross_entropy(F.linear(h.norm(h.hidden[h.mask]), h.weight), h.labels[h.mask], reduction="sum")
        assert int(h.mask.sum()) == counted and math.isclose(got.item(), expected, rel_tol=1e-12)
        assert h.draft_coverage.tolist() == [counted, tokens.shape[1] - h.k]


def test_the_coverage_metric_counts_targets_inside_the_set():
    model = tiny({"name": "parallel", "k": 3})
    tokens = torch.tensor([[1, 5, 2, 0, 5, 1, 7, 2, 2, 5], [3, 3, 5, 5, 4, 6, 1, 2, 0, 0]])
    segments = torch.tensor([[0] * 10, [0] * 8 + [-1] * 2])
    batch = make_batch(tokens, segments)
    objective = Objective.build({"policy": "head_mean"}, {"name": "uniform"}, {"name": "sequential"}, k=3)
    step = train_step(model.float(), objective, batch, Progress(step=0, consumed_tokens=0, total_steps=4), GradientsOnly(model))
    # h2 targets tokens[t+2]: row 0 [2,0,5,1,7,2,2,5] 6 in; row 1 (8 active) [5,5,4,6,1,2] 4 in, of 8 + 6
    # h3 targets tokens[t+3]: row 0 [0,5,1,7,2,2,5] 5 in; row 1 [5,4,6,1,2] 3 in, of 7 + 5
    assert step.draft_coverage.tolist() == [[10, 14], [8, 12]]
    assert step.counts[1:].tolist() == [10, 8]


@pytest.mark.parametrize("schedule", ["sequential", "chunked"])
def test_every_backward_schedule_gives_the_joint_gradients_through_the_sliced_projection(schedule):
    """Replicated projections train: their gradient reaches only the N draft rows, the same under every schedule."""
    tokens = torch.tensor([[1, 5, 2, 0, 5, 1, 7, 2, 2, 5]])
    batch = make_batch(tokens, torch.zeros_like(tokens))
    grads = {}
    for name in ("joint", schedule):
        model = tiny({"name": "linear", "k": 3, "unembedding": "replicated"}).float()
        objective = Objective.build({"policy": "head_mean"}, {"name": "uniform"}, {"name": name, "chunk_rows": 4}, k=3)
        train_step(model, objective, batch, Progress(step=0, consumed_tokens=0, total_steps=4), GradientsOnly(model))
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    outside = [i for i in range(V) if i not in DRAFT_IDS.tolist()]
    projection = grads["joint"]["head.projections.1"]  # [V, d] horizon 2's own lm_head
    assert projection[outside].abs().max() == 0 and projection[DRAFT_IDS].abs().max() > 0
    for name, grad in grads["joint"].items():
        torch.testing.assert_close(grads[schedule][name], grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("trunk", ["gpt", "hf"])
@pytest.mark.parametrize("head", [{"name": "parallel", "k": 3}, {"name": "deepseek", "depth": 2}, {"name": "medusa", "k": 3, "unembedding": "replicated"},
                                  {"name": "identity", "k": 3}])
def test_greedy_speculative_equals_plain_and_drafts_stay_in_the_set(trunk, head):
    model = tiny(head, trunk)
    for seed in range(3):
        prompt = torch.randint(0, V, (4,), generator=torch.Generator().manual_seed(seed))
        plain = generate(model, prompt, 12)
        spec = generate(model, prompt, 12, speculative=True)
        assert spec.tokens == plain.tokens
    if trunk == "gpt" and head["name"] != "deepseek":  # batched requests: every horizon projected in one call
        prompts = [torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(n)) for n in (3, 6)]
        batched = generate(model, prompts, 12, speculative=True)
        assert [b.tokens for b in batched] == [generate(model, p, 12).tokens for p in prompts]
    for k in range(2, model.k + 1):
        logits = model.horizon_logits(k, torch.randn(5, 8, dtype=torch.float64))  # [5, V]
        outside = torch.ones(V, dtype=torch.bool)
        outside[DRAFT_IDS] = False
        assert torch.isinf(logits[:, outside]).all() and torch.isfinite(logits[:, DRAFT_IDS]).all()


def test_a_greedy_tree_never_takes_an_id_outside_the_set():
    from lab.decode_core.sampling import TokenChooser
    from lab.decode_core.tree import ranked_candidates

    model = tiny({"name": "parallel", "k": 3})
    logits = model.horizon_logits(2, torch.randn(2, 8, dtype=torch.float64))  # [2, V]: -inf outside the 3 ids
    candidates, _ = ranked_candidates(logits, [5, 2], TokenChooser(0.0, None, None), vocab_limited=True)
    assert sorted(candidates[0]) == sorted(DRAFT_IDS.tolist())  # width 5 > N = 3: only the 3 ids
    assert len(candidates[1]) == 2 and set(candidates[1]) <= set(DRAFT_IDS.tolist())
    prompt = torch.tensor(PROMPT)
    assert generate(model, prompt, 12, speculative=True, tree=[5, 2]).tokens == generate(model, prompt, 12).tokens


LAW_CASES = [("gpt", {"name": "parallel", "k": 3}, None), ("gpt", {"name": "identity", "k": 3}, None), ("gpt", {"name": "deepseek", "depth": 2}, None),
             ("gpt", {"name": "linear", "k": 3}, [2, 2]), ("hf", {"name": "parallel", "k": 3}, None), ("hf", {"name": "linear", "k": 3}, [3, 1])]


@pytest.mark.parametrize("trunk, head, tree", LAW_CASES)
def test_the_sampling_law_is_exact_with_a_draft_vocabulary(trunk, head, tree):
    """q is over the N ids (zero elsewhere); the residual (p − q)+ over all V; enumerated over every draw."""
    model = tiny(head, trunk)
    law, _, rejections = enumerated_law(lambda draws: generate(model, torch.tensor(PROMPT), 2, temperature=1.0, speculative=True,
                                                               tree=tree, draws=draws))
    assert rejections > 0
    assert_same_law(law, exact_law(model, PROMPT, 2, 1.0, V))


def test_a_checkpointed_state_carries_the_ids():
    model = tiny({"name": "parallel", "k": 3})
    fresh = build_model({"vocab_size": V, "d_model": 8, "n_layers": 2, "n_heads": 2}, {"name": "parallel", "k": 3, "compute_match": "none", "draft_vocab": N}).double()
    fresh.load_state_dict(model.state_dict())
    assert fresh.draft_ids.tolist() == DRAFT_IDS.tolist()
    x = torch.randn(4, 8, dtype=torch.float64)
    torch.testing.assert_close(fresh.horizon_logits(2, x), model.horizon_logits(2, x), rtol=0, atol=0)  # same weights and input: same kernels
    assert "draft_ids" not in tiny({"name": "parallel", "k": 3}, ids=None).state_dict()  # the default writes nothing new


@pytest.mark.parametrize("value, message", [(0, "got 0"), (9, "(8), got 9"), ("many", "got 'many'"), (2.5, "got 2.5")])
def test_bad_sizes_are_refused_naming_the_field(value, message):
    with pytest.raises(ConfigError) as error:
        build_model({"vocab_size": V, "d_model": 8, "n_layers": 2, "n_heads": 2}, {"name": "parallel", "k": 3, "compute_match": "none", "draft_vocab": value})
    assert error.value.field == "head.draft_vocab" and message in error.value.message


def test_a_head_without_future_horizons_is_refused():
    with pytest.raises(ConfigError, match="head.k=1 has none"):
        build_model({"vocab_size": V, "d_model": 8, "n_layers": 2, "n_heads": 2}, {"name": "ntp", "draft_vocab": 3})


def test_a_cached_step_equals_a_live_step_under_a_draft_vocabulary(tmp_path):
    from tests.test_hidden_cache import HEADS, frozen_model, one_step, training_rows
    from lab.training.hidden_cache import open_hidden_cache

    for head, target in (("medusa", "distill"), ("deepseek", "data")):
        model = frozen_model({**HEADS[head], "draft_vocab": 20})
        rows = training_rows()
        model.set_draft_ids(most_frequent_ids(training_token_counts(rows, 61), 20))
        cached, _ = open_hidden_cache(model, rows, tmp_path / head, batch_size=4)
        live, live_grads = one_step(model, default_collate([rows[i] for i in (5, 0, 3)]), target)
        from_cache, cached_grads = one_step(model, default_collate([cached[i] for i in (5, 0, 3)]), target)
        assert 0 < live.draft_coverage[0, 0] < live.draft_coverage[0, 1]  # some targets fell outside the set
        torch.testing.assert_close(from_cache.loss, live.loss, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(from_cache.draft_coverage, live.draft_coverage, rtol=0, atol=0)
        for name, grad in live_grads.items():
            assert grad.abs().max() > 0, name
            torch.testing.assert_close(cached_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_distill_teacher_is_restricted_and_renormalised():
    """KL(p_N ‖ q) with p_N the next-token distribution softmaxed over the N ids only, checked by hand."""
    model = tiny({"name": "parallel", "k": 2}).float()
    tokens = torch.tensor([[1, 5, 2, 5, 5, 1, 2, 2]])
    batch = make_batch(tokens, torch.zeros_like(tokens))  # every target is inside the set
    objective = Objective.build({"policy": "head_mean"}, {"name": "uniform"}, {"name": "joint"}, k=2, objective={"target": "distill"})
    first, second = objective.training_targets(model(batch))
    rows = second.hidden[second.mask]  # [n, d]
    teacher = F.log_softmax(F.linear(first.norm(first.hidden[:, 1:][second.mask]), model.trunk.unembedding[DRAFT_IDS]), -1)  # [n, N]
    student = F.log_softmax(F.linear(second.norm(rows), model.trunk.unembedding[DRAFT_IDS]), -1)
    expected = (teacher.exp() * (teacher - student)).sum()
    step = train_step(model, objective, batch, Progress(step=0, consumed_tokens=0, total_steps=4), GradientsOnly(model))
    torch.testing.assert_close(step.loss_sums[1].float(), expected.detach(), rtol=1e-5, atol=1e-6)


def test_lab_train_with_a_draft_vocabulary_trains_decodes_and_logs_coverage(tmp_path, capsys):
    cache = tmp_path / "cache"
    out = lab_train(*TINY, "head=parallel", "head.k=3", "head.draft_vocab=40", "callbacks.decoding.budget_s=null",
                    "callbacks.decoding.prompts=2", "callbacks.decoding.new_tokens=8", f"hydra.run.dir={tmp_path / 'run'}",
                    cache_dir=cache, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    record = read_run(tmp_path / "run")
    assert record["draft_vocab"]["size"] == 40 and 0 < record["draft_vocab"]["train_token_coverage"] < 1
    metrics = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = metrics[0].split(",")
    for name in ("train/draft_vocab_coverage/h2", "val/draft_vocab_coverage/h3"):
        assert name in header, name
        column = header.index(name)
        values = [float(line.split(",")[column]) for line in metrics[1:] if line.split(",")[column]]
        assert values and all(0 < v < 1 for v in values), (name, values)
    ckpt = torch.load(sorted((tmp_path / "run").rglob("*.ckpt"))[-1], weights_only=True, map_location="cpu")
    saved = ckpt["state_dict"]["model.draft_ids"]
    assert saved.numel() == 40

    # decode time (lab-generate --draft-vocab): the same run's training counts give the same ids
    from lab.decode.cli import main as lab_generate
    from lab.decode.draft_vocab_source import apply_draft_vocab
    from lab.decode.loading import load_for_generation

    loaded = load_for_generation(tmp_path / "run")
    assert torch.equal(loaded.model.draft_ids, saved)  # the checkpoint carries them
    loaded.model.set_draft_ids(None)
    apply_draft_vocab(loaded.model, str(tmp_path / "run"), 40)
    assert torch.equal(loaded.model.draft_ids, saved)
    texts = []
    for extra in ([], ["--speculative", "--draft-vocab", "40"]):
        lab_generate([str(tmp_path / "run"), "--prompt", "def f(x):", "--max-new-tokens", "12", *extra])
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and len(texts[0]) > 1  # 12 tokens (a 6-step toy model writes spaces)
    from lab.release.export import export, load_release

    export(sorted((tmp_path / "run").rglob("*.ckpt"))[-1], tmp_path / "release", keep_heads=True)  # --keep-heads keeps the ids
    assert torch.equal(load_release(tmp_path / "release").draft_ids, saved)
    with pytest.raises(SystemExit) as exit_info:
        lab_generate([str(tmp_path / "run"), "--prompt", "x", "--speculative", "--draft-vocab", "30"])
    assert exit_info.value.code == 2 and "--draft-vocab: these heads were trained over a draft vocabulary of 40 ids" in capsys.readouterr().err


@pytest.mark.parametrize("value, shown", [("0", "got 0"), ("100000", "(259), got 100000")])  # refused by the config check; by the model build
def test_lab_train_refuses_a_bad_size_in_one_line_without_a_run_folder(value, shown, tmp_path):
    out = lab_train(*TINY, "head=parallel", "head.k=3", f"head.draft_vocab={value}", f"hydra.run.dir={tmp_path / 'run'}",
                    cache_dir=tmp_path / "cache", cwd=tmp_path)
    assert out.returncode == 2 and not (tmp_path / "run").exists()
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: head.draft_vocab: must be null (the full vocabulary) or an integer 1 ≤ N ≤ the vocabulary size"), last
    assert last.endswith(shown) and "Traceback" not in out.stderr


@pytest.mark.parametrize("ids", [DRAFT_IDS, None])
def test_the_decoders_projection_of_replicated_heads_is_each_horizons_own_logits(ids):
    """The decoder projects every draft horizon in one call (lab/model/heads/independent_drafter.py); against
    `horizon_logits` one horizon at a time. The heads' projections start as copies of the lm_head, which would hide a
    horizon projected on another's weights, so they are drawn apart first."""
    from lab.model.heads.independent_drafter import DraftProjection

    model = tiny({"name": "medusa", "k": 4, "unembedding": "replicated"}, ids=ids)
    with torch.no_grad():
        for projection in model.head.projections:
            projection.normal_()
    project = DraftProjection(model)
    rows = torch.randn(3, 8, dtype=torch.float64)  # [K-1, d]: horizon k's row at index k - 2
    torch.testing.assert_close(project(rows), torch.stack([model.horizon_logits(k, rows[k - 2]) for k in range(2, 5)]))
    one_row = rows[:1]  # [1, d]: every horizon reads the same row
    torch.testing.assert_close(project(one_row), torch.stack([model.horizon_logits(k, one_row[0]) for k in range(2, 5)]))
    batch = torch.randn(3, 2, 8, dtype=torch.float64)  # [K-1, B, d]: a batch of requests
    torch.testing.assert_close(project(batch), torch.stack([model.horizon_logits(k, batch[k - 2]) for k in range(2, 5)]))

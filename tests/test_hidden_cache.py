"""The hidden-state cache (lab/training/hidden_cache.py): a cached head-only step equals a live frozen step.

Oracle: the live step itself. For every head family that can train on a frozen trunk, one optimizer
step's loss, per-horizon sums and every head gradient from cached rows equal those of the same step
run through the trunk (tiny transformers Llama, float32), for data, distilled and mixed targets.
Perturbations: a damaged entry is refused in one line; other data or other trunk weights get an entry
of their own (never the stale one); a build that fails leaves no entry behind.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch
from hydra import compose, initialize_config_dir
from torch.utils.data import default_collate

from lab.errors import ConfigError
from lab.model.mtp import build_model
from lab.objective.objective import Objective
from lab.objective.weights import Progress
from lab.training.hidden_cache import HIDDEN, NEXT_TOKEN_HIT, NEXT_TOKEN_LOSS, open_hidden_cache
from lab.train import CONF_DIR
from lab.training.step import train_step
from tests.head_cases import case, without
from tests.cli import TINY, lab_train, read_run, runner
from tests.fit_helpers import fit
from tests.hf_fixtures import write_llama
from tests.helpers import hf_llama_config, make_batch

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB, SEQ = 61, 12
NOT_MODEL = [o for o in TINY if not o.startswith("model.")]
# Every head family that has Parameters of its own on a frozen trunk (identity has none: frozen refuses it).
HEADS = {
    **without("ntp", "identity"),
    "medusa-replicated": case("medusa", unembedding="replicated"),
}


class GradientsOnly:
    """The step's backward without an update, so the gradients can be compared."""

    def __init__(self, model):
        self.model = model

    def zero_grad(self):
        self.model.zero_grad(set_to_none=True)

    def backward(self, root):
        root.backward()

    def update(self):
        pass


def training_rows(seed: int = 0, n_rows: int = 6, greedy_from=None) -> list[dict]:
    """Packed rows of S=12: several documents per row, padding at the end of the last one. With `greedy_from` (a
    model), two tokens in three are that model's own greedy choice, so its next-token path hits some labels."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (n_rows, SEQ), generator=g)
    patterns = [[0] * 5 + [1] * 7, [0] * 12, [0] * 3 + [1] * 4 + [2] * 5, [0] * 8 + [1] * 4, [0] * 6 + [1] * 6, [0] * 9 + [-1] * 3]
    segments = torch.tensor([patterns[i % len(patterns)] for i in range(n_rows)])
    tokens[segments < 0] = 0
    for t in range(SEQ - 1) if greedy_from is not None else ():
        if t % 3 != 2:
            with torch.no_grad():
                choice = greedy_from.next_token_logits(make_batch(tokens, segments))[:, t].argmax(-1)  # [B]: predicts t+1
            tokens[:, t + 1] = torch.where(segments[:, t + 1] >= 0, choice, tokens[:, t + 1])
    batch = make_batch(tokens, segments)
    return [{name: value[i] for name, value in batch.items()} for i in range(n_rows)]


TRUNKS = {
    "hf": lambda dtype: {"name": "hf", "config": hf_llama_config(vocab=VOCAB, d_model=16, n_layers=2), "dtype": dtype},
    "gpt": lambda dtype: {"vocab_size": VOCAB, "d_model": 16, "n_layers": 2, "n_heads": 2},  # the harness's own trunk
}


def frozen_model(head: dict, dtype: str = "float32", seed: int = 0, trunk: str = "hf"):
    torch.manual_seed(seed)
    model = build_model(TRUNKS[trunk](dtype), {**head, "trunk_grad": "frozen", "n_layers": 1, "compute_match": "none"})
    with torch.no_grad():  # heads start away from their zero init (Medusa), so every gradient is non-trivial
        for param in model.head.parameters():
            if param.requires_grad:
                param.add_(0.1 * torch.randn_like(param))
    return model


def one_step(model, batch: dict, target: str):
    objective = Objective.build({"policy": "head_mean"}, {"name": "uniform"}, {"name": "sequential"}, k=model.k,
                                objective={"target": target, "mix_alpha": 0.3})
    outputs = train_step(model, objective, batch, Progress(step=0, consumed_tokens=0, total_steps=10), GradientsOnly(model))
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    return outputs, grads


CASES = [("hf", head, target) for head in sorted(HEADS) for target in ("data", "distill", "mix")]
CASES += [("gpt", head, "data") for head in ("deepseek", "medusa", "parallel")]


@pytest.mark.parametrize("trunk, head, target", CASES)
def test_a_cached_step_equals_a_live_frozen_step(trunk, head, target, tmp_path):
    model = frozen_model(HEADS[head], trunk=trunk)
    rows = training_rows()
    cached, record = open_hidden_cache(model, rows, tmp_path, batch_size=4)  # built in batches of 4, read in other batches
    assert record["built"] and len(cached) == len(rows)
    picked = [5, 0, 3]
    live_batch = default_collate([rows[i] for i in picked])
    cached_batch = default_collate([cached[i] for i in picked])
    assert cached_batch[HIDDEN].shape == (3, SEQ, 16) and HIDDEN not in live_batch

    live, live_grads = one_step(model, live_batch, target)
    calls = []
    handle = model.trunk.register_forward_pre_hook(lambda *args: calls.append(1))
    try:
        from_cache, cached_grads = one_step(model, cached_batch, target)
    finally:
        handle.remove()
    assert calls == []  # the cached step never ran the trunk
    torch.testing.assert_close(from_cache.loss, live.loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(from_cache.loss_sums, live.loss_sums, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(from_cache.counts, live.counts, rtol=0, atol=0)
    torch.testing.assert_close(from_cache.correct, live.correct, rtol=0, atol=0)  # horizon 1's hits from the cache too
    assert live_grads.keys() == cached_grads.keys() and live_grads
    assert not any(name.startswith("trunk.") for name in live_grads)  # heads only
    for name, grad in live_grads.items():
        assert grad.abs().max() > 0, f"{name} has no gradient: the comparison would be empty"
        torch.testing.assert_close(cached_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("trunk", sorted(TRUNKS))
def test_the_cached_next_token_loss_and_hits_are_the_trunks_own(trunk, tmp_path):
    """Oracle: the model's own next-token logits (`next_token_logits`, a separate code path), scored by hand."""
    model = frozen_model(HEADS["medusa"], trunk=trunk)
    rows = training_rows()
    cached, _ = open_hidden_cache(model, rows, tmp_path, batch_size=4)
    batch = default_collate(rows)
    logits = model.next_token_logits(batch)[:, :-1]  # [B, S-1, V]: row t predicts tokens[t+1]
    labels = batch["tokens"][:, 1:]  # [B, S-1]
    by_hand = -logits.log_softmax(-1).gather(-1, labels[..., None]).squeeze(-1)  # [B, S-1]
    stored = default_collate([cached[i] for i in range(len(rows))])
    assert stored[NEXT_TOKEN_LOSS].shape == (len(rows), SEQ - 1) and stored[NEXT_TOKEN_HIT].dtype == torch.bool
    torch.testing.assert_close(stored[NEXT_TOKEN_LOSS], by_hand, rtol=1e-5, atol=1e-6)
    assert torch.equal(stored[NEXT_TOKEN_HIT], logits.argmax(-1) == labels)


@pytest.mark.parametrize("head", sorted(HEADS))
def test_a_cached_step_takes_horizon_1_from_the_cache_exactly_when_it_is_the_frozen_trunks_own(head, tmp_path):
    """Perturbation: +1 nat on every cached next-token loss moves horizon 1's sum by N_1 for a head whose
    horizon 1 is the trunk's own path (no head block, no head projection) and not at all for the others;
    the gradients never move (horizon 1 has no gradient path on a frozen trunk)."""
    model = frozen_model(HEADS[head])
    rows = training_rows()
    cached, _ = open_hidden_cache(model, rows, tmp_path, batch_size=4)
    batch = default_collate([cached[i] for i in (5, 0, 3)])
    before, grads = one_step(model, batch, "data")
    shifted = {**batch, NEXT_TOKEN_LOSS: batch[NEXT_TOKEN_LOSS] + 1.0, NEXT_TOKEN_HIT: ~batch[NEXT_TOKEN_HIT]}
    after, shifted_grads = one_step(model, shifted, "data")
    path = model.head.next_token_path()
    trunks_own = path.blocks == () and path.projection is None and path.kept == ()
    moved = (after.loss_sums - before.loss_sums).tolist()
    assert moved[0] == pytest.approx(float(before.counts[0]) if trunks_own else 0.0, abs=1e-4), (head, moved)
    assert moved[1:] == [0.0] * (model.k - 1)
    for name, grad in grads.items():
        torch.testing.assert_close(shifted_grads[name], grad, rtol=0, atol=0, msg=name)  # the same ops on the same shapes
    if head in ("medusa", "deepseek"):
        assert trunks_own  # the heads this saves the most for do keep the trunk's path
    if head == "parallel":
        assert not trunks_own  # horizon 1 is the head's own block: always computed live


def test_bfloat16_cache_holds_the_trunk_states_bit_for_bit(tmp_path):
    model = frozen_model(HEADS["medusa"], dtype="bfloat16")
    rows = training_rows()
    cached, record = open_hidden_cache(model, rows, tmp_path, batch_size=len(rows))
    assert record["dtype"] == "bfloat16" and cached[0][HIDDEN].dtype == torch.bfloat16
    batch = default_collate(rows)
    with torch.no_grad():
        ctx = model.trunk.attention_context(batch["segment_ids"], batch["position_ids"], batch["active"])
        live = model.trunk(batch["tokens"], ctx)  # [B, S, d]
    # bitwise: one cache batch of every row (batch_size=len(rows)) is the live batch's shape, so the same kernels
    assert torch.equal(default_collate([cached[i] for i in range(len(rows))])[HIDDEN], live)


def test_a_second_open_hits_the_entry_and_reads_the_same_rows(tmp_path):
    model = frozen_model(HEADS["medusa"])
    rows = training_rows()
    first, built = open_hidden_cache(model, rows, tmp_path)
    second, hit = open_hidden_cache(model, rows, tmp_path)
    assert built["built"] and not hit["built"] and hit["key"] == built["key"]
    for i in range(len(rows)):
        for name, value in rows[i].items():
            assert torch.equal(second[i][name], value)
        assert torch.equal(second[i][HIDDEN], first[i][HIDDEN])


def test_a_damaged_entry_is_refused_in_one_line_not_used(tmp_path):
    model = frozen_model(HEADS["medusa"])
    rows = training_rows()
    _, record = open_hidden_cache(model, rows, tmp_path)
    hidden_file = tmp_path / record["key"] / f"{HIDDEN}.npy"
    data = np.load(hidden_file, mmap_mode="r+")
    data[2, 3, 4] += 1.0  # one number of one row changed on disk
    data.flush()
    del data
    with pytest.raises(ConfigError) as caught:
        open_hidden_cache(model, rows, tmp_path)
    message = str(caught.value)
    assert message.startswith("hidden_cache: ") and "\n" not in message
    assert f"{HIDDEN}.npy does not match its recorded sha256" in message and "delete" in message


@pytest.mark.parametrize("change", ["one token of the data", "one trunk weight"])
def test_other_data_or_other_weights_never_read_a_stale_entry(change, tmp_path):
    model = frozen_model(HEADS["medusa"])
    rows = training_rows()
    _, first = open_hidden_cache(model, rows, tmp_path)
    if change == "one token of the data":
        rows[4] = {**rows[4], "tokens": rows[4]["tokens"].clone()}
        rows[4]["tokens"][2] += 1
    else:
        with torch.no_grad():
            model.trunk.hf.model.layers[0].mlp.up_proj.weight[0, 0] += 0.5
    cached, second = open_hidden_cache(model, rows, tmp_path)
    assert second["built"] and second["key"] != first["key"]
    batch = default_collate(rows)
    with torch.no_grad():
        ctx = model.trunk.attention_context(batch["segment_ids"], batch["position_ids"], batch["active"])
        live = model.trunk(batch["tokens"], ctx)  # [B, S, d]
    torch.testing.assert_close(default_collate([cached[i] for i in range(len(rows))])[HIDDEN], live)


def test_a_build_that_fails_leaves_no_entry(tmp_path):
    model = frozen_model(HEADS["medusa"])
    rows = training_rows()

    class FailingRows(list):
        reads = 0

        def __getitem__(self, index):
            FailingRows.reads += 1
            if FailingRows.reads > len(rows) + 3:  # the fingerprint pass reads every row; the build fails mid-way
                raise OSError("disk went away")
            return super().__getitem__(index)

    with pytest.raises(OSError):
        open_hidden_cache(model, FailingRows(rows), tmp_path, batch_size=2)
    assert [p for p in tmp_path.iterdir() if p.suffix != ".lock"] == []  # neither an entry nor a partial folder
    _, record = open_hidden_cache(model, rows, tmp_path, batch_size=2)
    assert record["built"]


@pytest.mark.parametrize("trunk_grad", ["joint", "detached"])
def test_a_trunk_that_trains_is_refused(trunk_grad, tmp_path):
    torch.manual_seed(0)
    model = build_model({"name": "hf", "config": hf_llama_config(vocab=VOCAB)}, {"name": "medusa", "k": 3, "trunk_grad": trunk_grad})
    with pytest.raises(ConfigError, match=f"needs head.trunk_grad=frozen, got {trunk_grad}"):
        open_hidden_cache(model, training_rows(), tmp_path)
    batch = default_collate(training_rows())
    batch[HIDDEN] = torch.zeros(len(training_rows()), SEQ, model.trunk.cfg.d_model)
    with pytest.raises(ConfigError, match="needs head.trunk_grad=frozen"):
        model(batch)


# ---- through the real config, Trainer and CLI -----------------------------------------------------------

@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return write_llama(tmp_path_factory.mktemp("llama"))


class StepLosses(pl.Callback):
    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append((HIDDEN in batch, outputs["step"].loss.item(), outputs["step"].loss_sums.tolist()))


def test_training_from_the_cache_follows_the_live_run_step_for_step(llama_dir, cache_dir, tmp_path):
    overrides = ("model=hf", f"model.path={llama_dir}", "head=medusa", "head.k=3", "head.trunk_grad=frozen", "objective.target=mix",
                 "optim.warmup_steps=1")
    runs = {}
    for cached in (False, True):
        losses = StepLosses()
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("train", overrides=[*NOT_MODEL, *overrides, f"paths.cache_dir={cache_dir}", f"hidden_cache={str(cached).lower()}"])
        _, module, _ = fit(cfg, tmp_path / str(cached), max_steps=5, every=5, callbacks=[losses])
        runs[cached] = (losses.losses, {name: p.detach().clone() for name, p in module.model.head.named_parameters()})
    (live, live_heads), (cached, cached_heads) = runs[False], runs[True]
    assert [step[0] for step in live] == [False] * 5 and [step[0] for step in cached] == [True] * 5
    for (_, live_loss, live_sums), (_, cached_loss, cached_sums) in zip(live, cached, strict=True):
        assert cached_loss == pytest.approx(live_loss, rel=1e-5)
        assert cached_sums == pytest.approx(live_sums, rel=1e-5)
    for name, value in live_heads.items():
        torch.testing.assert_close(cached_heads[name], value, rtol=1e-4, atol=1e-6, msg=name)
    assert any(not torch.equal(value, torch.zeros_like(value)) for value in live_heads.values())


@pytest.mark.slow  # two CLI runs (~30 s idle); the step-for-step test above covers the same wiring in process
def test_lab_train_builds_the_cache_once_and_records_it(llama_dir, tmp_path):
    cache_dir = tmp_path / "cache"  # its own: another test's entry for these rows and weights would be a hit
    args = (*NOT_MODEL, "model=hf", f"model.path={llama_dir}", "head=medusa", "head.k=3", "head.trunk_grad=frozen", "hidden_cache=true",
            "trainer.max_steps=2", "trainer.val_check_interval=2")
    records = []
    for name in ("first", "second"):
        out = lab_train(*args, f"hydra.run.dir={tmp_path / name}", cache_dir=cache_dir, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        records.append(read_run(tmp_path / name)["hidden_cache"])
    assert records[0]["built"] and not records[1]["built"] and records[0]["key"] == records[1]["key"]
    assert Path(records[0]["path"]).parent == Path(cache_dir) / "hidden"


REFUSED = {
    "a trunk that trains": (["head.trunk_grad=joint"], "needs head.trunk_grad=frozen, got joint"),
    "streamed rows": (["head.trunk_grad=frozen", "data.streaming=true", "data.max_docs=null"], "data.streaming=true has none"),
    "autocast": (["head.trunk_grad=frozen", "trainer.precision=bf16-mixed"], "set model.dtype=bfloat16"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_lab_train_refuses_what_the_cache_cannot_serve_in_one_line(case, llama_dir, cache_dir, tmp_path):
    """The first case as a real process, the others in this process (tests/cli.py `runner`)."""
    overrides, words = REFUSED[case]
    run_dir = tmp_path / "run"
    entries = lambda: sorted((Path(cache_dir) / "hidden").glob("*"))  # noqa: E731 (other tests' entries may be there)
    before = entries()
    out = runner(overrides, {"head.trunk_grad=joint"})(*NOT_MODEL, "model=hf", f"model.path={llama_dir}", "head=medusa", "head.k=3",
                                                      "hidden_cache=true", *overrides, f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: hidden_cache:") and words in lines[0], lines
    assert not run_dir.exists() and entries() == before


def truncating_step(model, batch: dict, target: str):
    """One step with truncation at the first miss and training-time acceptance read (lab/objective/readings.py)."""
    objective = Objective.build({"policy": "head_mean"}, {"name": "uniform"}, {"name": "sequential"}, k=model.k,
                                objective={"target": target, "truncate": "first_miss"})
    outputs = train_step(model, objective, batch, Progress(step=0, consumed_tokens=0, total_steps=10), GradientsOnly(model),
                         measure_acceptance=True)
    return outputs, {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("head, target", [("medusa", "data"), ("deepseek", "data"), ("medusa", "distill")])
def test_first_miss_truncation_and_acceptance_from_the_cache_equal_the_live_step(head, target, tmp_path):
    """The readings' hidden-cache branch (horizon 1's hits from the cache, no next-token logits for `data` without
    acceptance): the kept rows, α, agreement and gradients equal the live step's. Perturbation: the cached hits
    inverted move the kept rows (the cache's hits are what truncation reads)."""
    model = frozen_model(HEADS[head])
    rows = training_rows(greedy_from=model)
    cached, _ = open_hidden_cache(model, rows, tmp_path, batch_size=4)
    picked = [5, 0, 3, 1]
    live, live_grads = truncating_step(model, default_collate([rows[i] for i in picked]), target)
    cached_batch = default_collate([cached[i] for i in picked])
    from_cache, cached_grads = truncating_step(model, cached_batch, target)
    kept, supervised = live.truncation[:, 0], live.truncation[:, 1]
    assert 0 < kept[1] < supervised[1]  # some rows kept, some cut: the comparison is not trivial
    assert torch.equal(from_cache.truncation, live.truncation)
    torch.testing.assert_close(from_cache.acceptance, live.acceptance, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(from_cache.loss_sums, live.loss_sums, rtol=1e-6, atol=1e-6)
    for name, grad in live_grads.items():
        torch.testing.assert_close(cached_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    inverted, _ = truncating_step(model, {**cached_batch, NEXT_TOKEN_HIT: ~cached_batch[NEXT_TOKEN_HIT]}, target)
    assert not torch.equal(inverted.truncation[1:, 0], live.truncation[1:, 0])

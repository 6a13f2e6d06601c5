"""Training rows the model writes itself (`train_rows=generated`, lab/decode/generated_rows.py).

Oracles: a greedy row is the model's own greedy continuation, recomputed by hand with full (uncached)
forwards of its next-token logits, one token at a time, one prompt at a time; a sampled row's first new
token follows softmax(logits / T) of those same logits (a frequency test over thousands of rows, which
the law at another temperature fails). Perturbations: other settings get other entries, a damaged entry
is refused in one line, and through the real config and Trainer every training batch is generated rows.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from lab.errors import ConfigError
from lab.model.mtp import build_model
from lab.decode.generated_rows import GeneratedRows, TrainRowsConfig, open_generated_rows
from lab.training.hidden_cache import rows_fingerprint
from hydra import compose, initialize_config_dir

from lab.train import CONF_DIR
from tests.cli import SUBPROCESS_TIMEOUT, TINY, kill_session, one_error_line, runner, start_lab_train
from tests.fit_helpers import fit
from tests.hf_fixtures import write_llama
from tests.helpers import hf_llama_config, make_batch

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB, SEQ, PROMPT = 61, 12, 4
NOT_MODEL = [o for o in TINY if not o.startswith("model.")]
TRUNKS = {
    "hf": {"name": "hf", "config": hf_llama_config(vocab=VOCAB, d_model=16, n_layers=2)},
    "gpt": {"vocab_size": VOCAB, "d_model": 16, "n_layers": 2, "n_heads": 2},
}
# medusa keeps the trunk's next-token path (transformers' generate decodes it); parallel's horizon 1 is its own
# block, so its rows are decoded through lab.decode
HEADS = {"medusa": {"name": "medusa", "k": 3}, "parallel": {"name": "parallel", "k": 2, "n_layers": 1}}


def model_of(trunk: str, head: str = "medusa", seed: int = 0):
    torch.manual_seed(seed)
    return build_model(TRUNKS[trunk], {**HEADS[head], "trunk_grad": "frozen", "compute_match": "none"})


def corpus_rows(n_rows: int = 5, seq_len: int = SEQ, seed: int = 0) -> list[dict]:
    """Packed rows with two documents each (the prompt of row 0 crosses no boundary, row 1's does)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (n_rows, seq_len), generator=g)
    segments = torch.tensor([[0] * 6 + [1] * (seq_len - 6) if i % 2 == 0 else [0] * 2 + [1] * (seq_len - 2) for i in range(n_rows)])
    batch = make_batch(tokens, segments)
    return [{name: value[i] for name, value in batch.items()} for i in range(n_rows)]


def greedy_by_hand(model, prompt: torch.Tensor, new_tokens: int) -> list[int]:
    """Full forwards of the model's next-token logits over the whole sequence so far, argmax of the last row."""
    sequence = prompt.tolist()
    with torch.no_grad():
        for _ in range(new_tokens):
            n = len(sequence)
            batch = make_batch([sequence], [[0] * n])
            sequence.append(int(model.next_token_logits(batch)[0, -1].argmax()))
    return sequence[prompt.numel():]


@pytest.mark.parametrize("trunk, head", [("hf", "medusa"), ("hf", "parallel"), ("gpt", "medusa")])
def test_greedy_rows_are_the_models_own_greedy_continuation(trunk, head, tmp_path):
    model = model_of(trunk, head)
    rows = corpus_rows()
    config = TrainRowsConfig(source="generated", prompt_tokens=PROMPT, temperature=0.0, batch_size=2)
    generated, record = open_generated_rows(model, rows, config, seed=0, root=tmp_path)
    assert record["built"] and len(generated) == len(rows)
    for index, row in enumerate(rows):
        prompt = row["tokens"][:PROMPT]
        expected = greedy_by_hand(model, prompt, SEQ - PROMPT)
        assert generated[index]["tokens"][:PROMPT].tolist() == prompt.tolist()
        assert generated[index]["tokens"][PROMPT:].tolist() == expected, (trunk, head, index)


def test_generated_rows_are_one_full_segment(tmp_path):
    model = model_of("hf")
    config = TrainRowsConfig(source="generated", prompt_tokens=PROMPT, temperature=1.0)
    generated, _ = open_generated_rows(model, corpus_rows(), config, seed=0, root=tmp_path)
    batch = default_collate([generated[i] for i in range(len(generated))])
    assert sorted(batch) == ["active", "position_ids", "segment_ids", "tokens"]
    assert batch["tokens"].shape == (5, SEQ) and batch["tokens"].dtype == torch.int64
    assert bool(batch["active"].all()) and batch["active"].dtype == torch.bool
    assert bool((batch["segment_ids"] == 0).all())
    assert torch.equal(batch["position_ids"], torch.arange(SEQ).expand(5, SEQ))
    with pytest.raises(IndexError):
        generated[5]


@pytest.mark.parametrize("trunk", sorted(TRUNKS))
def test_sampled_rows_follow_the_models_law_at_the_temperature(trunk, tmp_path):
    """4,000 copies of one prompt, one new token each: its frequencies match softmax(logits / 0.7) within 4.5
    standard errors per token, and the law at T=1 (what a decoder ignoring the temperature would draw) does not."""
    model = model_of(trunk)
    prompt_batch = make_batch([corpus_rows()[0]["tokens"][:PROMPT].tolist()], [[0] * PROMPT])
    with torch.no_grad():  # logits spread to a std of ~1.5 (a random tiny model's are nearly flat): the final norm scales them
        model.trunk.final_norm.weight.mul_(1.5 / float(model.next_token_logits(prompt_batch)[0, -1].std()))
    n_rows, temperature = 4000, 0.7
    prompt = corpus_rows()[0]["tokens"][:PROMPT]
    row = {"tokens": torch.cat([prompt, torch.ones(1, dtype=torch.long)])}  # S = P + 1: one generated token
    config = TrainRowsConfig(source="generated", prompt_tokens=PROMPT, temperature=temperature, batch_size=1000)
    generated, _ = open_generated_rows(model, [row] * n_rows, config, seed=3, root=tmp_path)
    drawn = torch.from_numpy(np.array(generated.tokens[:, PROMPT]))  # [N]
    frequencies = torch.bincount(drawn, minlength=VOCAB).double() / n_rows  # [V]
    with torch.no_grad():
        logits = model.next_token_logits(prompt_batch)[0, -1].double()  # [V]

    def worst_deviation(law: torch.Tensor) -> float:
        error = (law * (1 - law) / n_rows).sqrt() + 1e-4
        return float(((frequencies - law).abs() / error).max())

    assert worst_deviation(torch.softmax(logits / temperature, -1)) < 4.5
    assert worst_deviation(torch.softmax(logits, -1)) > 4.5  # the test can tell the temperature apart


def test_an_entry_is_reused_and_its_settings_key_it(tmp_path):
    model = model_of("hf")
    rows = corpus_rows()
    config = TrainRowsConfig(source="generated", prompt_tokens=PROMPT, temperature=1.0)
    first, built = open_generated_rows(model, rows, config, seed=0, root=tmp_path)
    second, hit = open_generated_rows(model, rows, config, seed=0, root=tmp_path)
    assert built["built"] and not hit["built"] and hit["key"] == built["key"]
    assert np.array_equal(np.array(first.tokens), np.array(second.tokens))
    other_seed, record = open_generated_rows(model, rows, config, seed=1, root=tmp_path)
    assert record["built"] and record["key"] != built["key"]
    assert not np.array_equal(np.array(other_seed.tokens), np.array(first.tokens))  # another seed draws other tokens
    for changed in (TrainRowsConfig(source="generated", prompt_tokens=PROMPT + 1), TrainRowsConfig(source="generated", prompt_tokens=PROMPT, temperature=0.5),
                    TrainRowsConfig(source="generated", prompt_tokens=PROMPT, batch_size=2)):
        assert open_generated_rows(model, rows, changed, seed=0, root=tmp_path)[1]["key"] != built["key"]
    with torch.no_grad():
        model.trunk.hf.model.layers[0].mlp.up_proj.weight[0, 0] += 0.5  # other weights write other rows
    assert open_generated_rows(model, rows, config, seed=0, root=tmp_path)[1]["key"] != built["key"]


def test_a_head_on_the_next_token_path_keys_the_entry_and_other_heads_do_not(tmp_path):
    """Medusa's horizon 1 is the trunk's own: its blocks do not write the rows. Parallel's horizon 1 runs its first
    block: changing that block changes the rows, so it must change the key."""
    rows = corpus_rows()
    config = TrainRowsConfig(source="generated", prompt_tokens=PROMPT, temperature=0.0)
    for head, moves in (("medusa", False), ("parallel", True)):
        model = model_of("hf", head)
        _, before = open_generated_rows(model, rows, config, seed=0, root=tmp_path / head)
        with torch.no_grad():
            for param in model.head.parameters():
                param.add_(0.3)
        written, after = open_generated_rows(model, rows, config, seed=0, root=tmp_path / head)
        assert (after["key"] != before["key"]) is moves and after["built"] is moves, head
        if moves:  # the new entry is what the changed model writes
            assert written[0]["tokens"][PROMPT:].tolist() == greedy_by_hand(model, rows[0]["tokens"][:PROMPT], SEQ - PROMPT)


def test_a_prompt_that_fills_the_row_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=f"train_rows.prompt_tokens: must be below the rows' length {SEQ}"):
        open_generated_rows(model_of("hf"), corpus_rows(), TrainRowsConfig(source="generated", prompt_tokens=SEQ), seed=0, root=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_damaged_entry_is_refused_in_one_line(tmp_path):
    model = model_of("hf")
    config = TrainRowsConfig(source="generated", prompt_tokens=PROMPT)
    _, record = open_generated_rows(model, corpus_rows(), config, seed=0, root=tmp_path)
    stored = np.load(tmp_path / record["key"] / "tokens.npy", mmap_mode="r+")
    stored[1, PROMPT] += 1  # one generated token changed on disk
    stored.flush()
    del stored
    with pytest.raises(ConfigError) as caught:
        open_generated_rows(model, corpus_rows(), config, seed=0, root=tmp_path)
    message = str(caught.value)
    assert message.startswith("train_rows: ") and "\n" not in message and "tokens.npy does not match its recorded sha256" in message


@pytest.mark.parametrize("values, words", [
    ({"source": "model"}, "train_rows.source: must be one of corpus, generated"),
    ({"prompt_tokens": 0}, "train_rows.prompt_tokens: must be an integer ≥ 1"),
    ({"temperature": -0.5}, "train_rows.temperature: must be a finite number ≥ 0"),
    ({"temperature": float("nan")}, "train_rows.temperature: must be a finite number ≥ 0"),
    ({"batch_size": 0}, "train_rows.batch_size: must be an integer ≥ 1"),
    ({"seed": -1}, "train_rows.seed: must be an integer ≥ 0, or null for the run's seed"),
    ({"seed": 1.5}, "train_rows.seed: must be an integer ≥ 0, or null for the run's seed"),
])
def test_the_config_refuses_what_makes_no_sense(values, words):
    with pytest.raises(ConfigError, match=words):
        TrainRowsConfig(**{"source": "generated", **values})


# ---- through the real config, Trainer and CLI -----------------------------------------------------------

@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return write_llama(tmp_path_factory.mktemp("llama"))


class TrainingTokens:
    """Every training batch's tokens, as the step received them."""

    def __init__(self):
        import pytorch_lightning as pl

        outer = self

        class Recorder(pl.Callback):
            def on_train_batch_start(self, trainer, module, batch, batch_idx):
                outer.batches.append(batch["tokens"].clone())

        self.batches, self.callback = [], Recorder()


@pytest.mark.parametrize("hidden_cache", [False, True])
def test_training_reads_the_generated_rows(hidden_cache, llama_dir, cache_dir, tmp_path):
    """Every row a step trains on is a generated row (prompt from the corpus row, the rest the model's),
    with and without the hidden-state cache, whose entry is then keyed by the generated rows."""
    overrides = [*NOT_MODEL, "model=hf", f"model.path={llama_dir}", "head=medusa", "head.k=3", "head.trunk_grad=frozen",
                 "train_rows=generated", "train_rows.prompt_tokens=8", f"hidden_cache={str(hidden_cache).lower()}",
                 f"paths.cache_dir={tmp_path / 'cache'}"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    recorder = TrainingTokens()
    _, _, datamodule = fit(cfg, tmp_path / "run", max_steps=3, every=3, callbacks=[recorder.callback])
    corpus = default_collate([datamodule.train_rows[i] for i in range(len(datamodule.train_rows))])["tokens"]  # [N, S]
    generated_dir = next((tmp_path / "cache" / "generated").glob("[0-9a-f]*[0-9a-f]"))
    generated = torch.from_numpy(np.load(generated_dir / "tokens.npy"))  # [N, S]
    assert generated.shape == corpus.shape and torch.equal(generated[:, :8], corpus[:, :8])
    assert not torch.equal(generated[:, 8:], corpus[:, 8:])
    stored = {tuple(row.tolist()) for row in generated}
    assert len(recorder.batches) == 3
    for batch in recorder.batches:
        assert all(tuple(row.tolist()) in stored for row in batch)
    if hidden_cache:
        entry = next((tmp_path / "cache" / "hidden").glob("[0-9a-f]*[0-9a-f]"))
        meta = __import__("json").loads((entry / "meta.json").read_text())
        assert meta["rows"] == rows_fingerprint(GeneratedRows(np.load(generated_dir / "tokens.npy")))


@pytest.mark.slow  # 25–50 s of one worker (tests/README.md)
def test_train_rows_seed_lets_another_run_seed_train_on_the_same_rows(llama_dir, cache_dir, tmp_path):
    """`seed=1 train_rows.seed=0` reads the entry that `seed=0` wrote (and the hidden cache over it); `seed=1` alone
    writes its own rows. The run seed still drives training (it orders the batches), so the two runs on one set of
    rows train differently."""
    cache = tmp_path / "cache"
    base = [*NOT_MODEL, "model=hf", f"model.path={llama_dir}", "head=medusa", "head.k=3", "head.trunk_grad=frozen",
            "train_rows=generated", "train_rows.prompt_tokens=8", "hidden_cache=true", f"paths.cache_dir={cache}"]
    runs = {}
    for name, extra in (("seed0", ["seed=0"]), ("seed1_rows0", ["seed=1", "train_rows.seed=0"]), ("seed1", ["seed=1"])):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("train", overrides=[*base, *extra])
        _, module, _ = fit(cfg, tmp_path / name, max_steps=1, every=1)
        entries = sorted(entry.name for entry in (cache / "generated").iterdir() if entry.is_dir() and not entry.name.startswith("."))
        runs[name] = (entries, [p.detach().clone() for p in module.model.head.parameters()])
    assert len(runs["seed0"][0]) == 1 and runs["seed1_rows0"][0] == runs["seed0"][0]  # no second entry written
    assert len(runs["seed1"][0]) == 2  # the run's own seed samples other rows
    hidden = [entry for entry in (cache / "hidden").iterdir() if entry.is_dir() and not entry.name.startswith(".")]
    assert len(hidden) == 2  # one hidden-state entry per set of rows
    heads0, heads1 = runs["seed0"][1], runs["seed1_rows0"][1]
    assert any(not torch.equal(a, b) for a, b in zip(heads0, heads1))  # the run seed still orders the batches


BAD = {
    "no room to write": (["data.seq_len=32", "train_rows.prompt_tokens=32"], "error: train_rows.prompt_tokens: must be below data.seq_len=32"),
    "a synthetic task": (["data=star_graph"], "error: train_rows: generated rows continue a text corpus"),
    "a negative temperature": (["train_rows.temperature=-1"], "error: train_rows.temperature: must be a finite number ≥ 0"),
    # issue 56: a 2-step run began writing 13,048 rows with a random trunk (ETA 2-4 h)
    "a random trunk": ([], "error: train_rows: generated rows are the model's own continuations, and this trunk starts from random"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_lab_train_refuses_bad_generated_rows_in_one_line(case, tmp_path):
    """The first case as a real process, the others in this process (tests/cli.py `runner`)."""
    overrides, words = BAD[case]
    run_dir, cache_dir = tmp_path / "run", tmp_path / "cache"
    out = runner(overrides, {"train_rows.prompt_tokens=32"})("train_rows=generated", *overrides, f"hydra.run.dir={run_dir}",
                                                            cache_dir=cache_dir, cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert one_error_line(out).startswith(words), out.stderr
    assert not run_dir.exists() and not (cache_dir / "generated").exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_rows_are_written_stops_in_one_line_and_leaves_nothing(signum, llama_dir, tmp_path):
    """Issue 56: SIGTERM while the rows were written exited 143 with no message, leaving `.hydra/`, `.lock` and
    `train.log` but no run.json; Ctrl-C printed a traceback. Now: one `interrupted:` line, 128 + the signal,
    no run folder (nothing was trained in it) and no partial cache entry."""
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    many_slow_rows = ["data.max_docs=200", "data.seq_len=128", "train_rows.prompt_tokens=8", "train_rows.batch_size=1"]
    process = start_lab_train(*NOT_MODEL, "model=hf", f"model.path={llama_dir}", "head=medusa", "head.k=2", "head.trunk_grad=frozen",
                              "train_rows=generated", *many_slow_rows, f"paths.cache_dir={cache}", f"hydra.run.dir={run_dir}",
                              cache_dir=cache, cwd=tmp_path)
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT
        while not list((cache / "generated").glob(".*.partial-*")):  # the rows are being written
            assert process.poll() is None, process.stderr.read()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(0.5)
        (os.killpg if signum == signal.SIGINT else os.kill)(process.pid, signum)  # Ctrl-C reaches the whole group
        stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT)[1]
    finally:
        kill_session(process)
    assert process.returncode == 128 + signum, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last == (f"interrupted: {run_dir}: stopped by {signum.name} during start-up, before training began; nothing was "
                    "trained (its new run folder removed)"), stderr[-3000:]
    assert "Traceback" not in stderr and not run_dir.exists()
    assert not list((cache / "generated").glob(".*partial*"))
    assert not [entry for entry in (cache / "generated").glob("[0-9a-f]*") if entry.is_dir()]  # its lock file may stay

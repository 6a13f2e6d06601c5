"""Data pipeline: sources, tokenizers, packing and the DataModule, with real `datasets`."""

from __future__ import annotations

import dataclasses
import gzip
import inspect
import itertools
import json
import pathlib
import pickle
import shlex

import datasets
import numpy as np
import pytest
import torch
import zstandard

from lab.data import (
    BPETokenizer,
    ByteTokenizer,
    DataConfig,
    HubDataset,
    LMDataModule,
    build_tokenizer,
    load_corpus,
    pack_documents,
    pack_stream,
    pack_tokenized,
    token_stream,
    tokenize_documents,
    unigram_entropy_bits,
    validate_data_config,
)
from lab.data.packing import token_dtype, tokenized_features
from lab.data.sampler import ResumableSampler
from lab.data.hub_source import hub_fingerprint
from lab.data.tokenizers import bpe_cache_path
from lab.errors import ConfigError
from tests.cli import TINY, lab_train, read_run, SUBPROCESS_TIMEOUT
from tests.fit_helpers import fit

REPO = pathlib.Path(__file__).resolve().parents[1]

EOS, PAD = ByteTokenizer.eos_id, ByteTokenizer.pad_id


def raises_config_error(field: str):
    return pytest.raises(ConfigError, match=rf"^{field}: ")


def write_jsonl(path, texts, field="text"):
    path.write_text("".join(json.dumps({field: t, "id": i}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    return path


def numbered_docs(n):
    return [f"document {i}: " + "word " * (i % 7 + 1) + "é" for i in range(n)]


def split_texts(corpus):
    return list(corpus.train["text"]), list(corpus.val["text"])


# ------------------------------------------------------------------- tokenizers


def test_byte_tokenizer_round_trips_non_ascii():
    tokenizer = ByteTokenizer()
    text = "naïve café — 東京 🚀\n\tok"
    ids = tokenizer.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert len(ids) == len(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids + [EOS, PAD]) == text  # specials are skipped
    assert (tokenizer.vocab_size, tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (259, 256, 257, 258)
    assert [list(a) for a in tokenizer.encode_batch(["é", ""])] == [[195, 169], []]
    assert tokenizer.identity == {"kind": "byte", "vocab_size": 259}
    assert tokenizer.token_byte_lengths().tolist() == [1] * 256 + [0, 0, 0]


def test_bpe_vocab_size_below_bytes_plus_specials_raises():
    with raises_config_error("data.vocab_size") as error:
        build_tokenizer("bpe", 258, [], None, "fp")
    assert "got 258" in str(error.value) and "259" in str(error.value)
    with raises_config_error("data.vocab_size"):
        build_tokenizer("bpe", None, [], None, "fp")


def test_unknown_tokenizer_kind_raises():
    with raises_config_error("data.tokenizer") as error:
        build_tokenizer("wordpiece", None, [], None, "fp")
    assert "allowed: byte, bpe" in str(error.value)


def test_bpe_trains_round_trips_and_loads_from_cache(tmp_path):
    texts = ["def add(a, b):\n    return a + b\n", "class Point:\n    x: int = 0\n"] * 20
    tokenizer = build_tokenizer("bpe", 300, iter(texts), tmp_path, "fingerprint-1")
    cache_file = bpe_cache_path(tmp_path, "fingerprint-1", 300)
    assert cache_file.is_file()
    sample = "def add_point(p):\n    return p.x + 1  # ünïcode ✓ <|eos|>"
    ids = tokenizer.encode(sample)
    assert tokenizer.decode(ids) == sample
    assert tokenizer.eos_id not in ids  # special-token text stays text
    assert len(tokenizer.encode(texts[0])) < len(texts[0])  # merges were learned
    assert max(ids) < tokenizer.vocab_size == 300
    assert len({tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}) == 3

    def must_not_train():
        raise AssertionError("the cached tokenizer should have been loaded")
        yield  # pragma: no cover

    cached = build_tokenizer("bpe", 300, must_not_train(), tmp_path, "fingerprint-1")
    assert isinstance(cached, BPETokenizer)
    assert cached.identity == tokenizer.identity
    assert cached.identity["kind"] == "bpe" and len(cached.identity["sha256"]) == 64
    assert cached.encode(sample) == ids
    byte_lengths = cached.token_byte_lengths()
    assert byte_lengths.shape == (300,) and byte_lengths[[cached.bos_id, cached.eos_id, cached.pad_id]].sum() == 0
    assert byte_lengths[ids].sum() == len(sample.encode("utf-8"))


# ---------------------------------------------------------------------- packing


def test_packing_hand_computed_example():
    docs = datasets.Dataset.from_dict({"text": ["ab", "c", "defg"]})
    rows = pack_tokenized(tokenize_documents(docs, ByteTokenizer()), seq_len=8, pad_id=PAD)
    a, b, c, d, e, f, g = (ord(ch) for ch in "abcdefg")
    F, T = False, True
    assert rows.tokens.tolist() == [[a, b, EOS, c, EOS, d, e, f], [g, EOS, PAD, PAD, PAD, PAD, PAD, PAD]]
    assert rows.active.tolist() == [[T] * 8, [T, T, F, F, F, F, F, F]]
    assert rows.segment_ids.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2], [0, 0, -1, -1, -1, -1, -1, -1]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 0, 0, 0, 0, 0, 0]]
    assert rows.tokens.dtype == rows.segment_ids.dtype == rows.position_ids.dtype == torch.long
    assert rows.active.dtype == torch.bool


def test_long_document_continues_as_new_occurrence_in_next_row():
    rows = pack_documents([list(range(10, 20)), [30, EOS]], seq_len=4, pad_id=PAD)
    assert rows.tokens.tolist() == [[10, 11, 12, 13], [14, 15, 16, 17], [18, 19, 30, EOS]]
    assert rows.segment_ids.tolist() == [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 1]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 0, 1]]
    assert rows.active.all()  # an exact fit needs no padding


@pytest.mark.parametrize("seq_len", [2, 3, 8, 37])
def test_packing_segments_never_cross_documents(seq_len):
    rng = np.random.default_rng(seq_len)
    lengths = rng.integers(1, 3 * seq_len, size=40)
    # Token = 1000 * doc + position: every token says which document and where it came from.
    docs = [[1000 * (i + 1) + p for p in range(n)] for i, n in enumerate(lengths)]
    rows = pack_documents(docs, seq_len=seq_len, pad_id=-7)
    tokens, active = rows.tokens.numpy(), rows.active.numpy()
    segments, positions = rows.segment_ids.numpy(), rows.position_ids.numpy()
    n_rows = tokens.shape[0]
    assert tokens.shape == (n_rows, seq_len) and n_rows == -(-lengths.sum() // seq_len)

    # Padding: only in the last row, only at its tail, with segment -1 and position 0.
    assert active[:-1].all()
    n_real = int(active[-1].sum())
    assert active[-1, :n_real].all() and not active[-1, n_real:].any()
    assert (segments[~active] == -1).all() and (positions[~active] == 0).all() and (tokens[~active] == -7).all()

    # The active tokens, read row by row, are exactly the concatenated documents.
    assert tokens[active].tolist() == [t for doc in docs for t in doc]

    for row in range(n_rows):
        n_segments = segments[row][active[row]].max() + 1
        for segment in range(n_segments):
            where = np.flatnonzero(segments[row] == segment)
            assert (np.diff(where) == 1).all()  # contiguous
            chunk = tokens[row, where]
            doc_ids, doc_positions = chunk // 1000, chunk % 1000
            assert len(set(doc_ids)) == 1  # one document
            assert (np.diff(doc_positions) == 1).all()  # its tokens in order
            assert positions[row, where].tolist() == list(range(len(where)))  # restart at 0
            if segment > 0 or row == 0:
                assert doc_positions[0] == 0  # only occurrence 0 may continue a document
            elif doc_positions[0] > 0:  # a continuation: the previous row ended inside this document
                assert tokens[row - 1, -1] == chunk[0] - 1


def test_seq_len_below_two_raises():
    with raises_config_error("data.seq_len") as error:
        pack_documents([[1, EOS]], seq_len=1, pad_id=PAD)
    assert "got 1" in str(error.value)
    with raises_config_error("data.seq_len"):
        LMDataModule(seq_len=1)


def test_unigram_entropy():
    assert unigram_entropy_bits(np.array([0, 1, 0, 1])) == pytest.approx(1.0)
    assert unigram_entropy_bits(np.array([5, 5, 5])) == 0.0
    assert unigram_entropy_bits(np.arange(8)) == pytest.approx(3.0)


# ---------------------------------------------------------------------- sources


def test_local_text_jsonl_parquet_load(tmp_path):
    texts = numbered_docs(30)
    text_file = tmp_path / "docs.txt"
    text_file.write_text("\n".join(texts) + "\n\n", encoding="utf-8")  # one document per line
    jsonl_file = write_jsonl(tmp_path / "docs.jsonl", texts, field="body")
    parquet_file = tmp_path / "docs.parquet"
    datasets.Dataset.from_dict({"text": texts}).to_parquet(str(parquet_file))

    cases = [("text", text_file, "text"), ("jsonl", jsonl_file, "body"), ("parquet", parquet_file, "text")]
    for source, path, field in cases:
        corpus = load_corpus(source, path=str(path), text_field=field, val_fraction=0.3, cache_dir=tmp_path / "cache")
        train, val = split_texts(corpus)
        assert corpus.train.column_names == ["text"]
        assert sorted(train + val) == sorted(texts), source  # empty lines dropped by min_doc_chars=1
        assert train and val


def test_missing_file_raises_naming_data_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with raises_config_error("data.path") as error:
        load_corpus("jsonl", path=str(missing))
    assert "no such file" in str(error.value) and "\n" not in str(error.value)
    with raises_config_error("data.path"):
        LMDataModule(source="jsonl", path=[str(missing)], cache_dir=str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()  # failed before any work


def test_missing_text_field_raises(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", ["a", "b"])
    with raises_config_error("data.text_field") as error:
        load_corpus("jsonl", path=str(path), text_field="content", cache_dir=tmp_path)
    assert "available: " in str(error.value)


def test_empty_corpus_raises(tmp_path):
    empty_docs = write_jsonl(tmp_path / "empty.jsonl", ["", "", ""])
    with raises_config_error("data") as error:
        load_corpus("jsonl", path=str(empty_docs), cache_dir=tmp_path)
    assert "corpus is empty after filtering" in str(error.value)
    docs = write_jsonl(tmp_path / "docs.jsonl", ["short", "tiny"])
    with raises_config_error("data"):
        load_corpus("jsonl", path=str(docs), min_doc_chars=100, cache_dir=tmp_path)
    with raises_config_error("data"):
        load_corpus("jsonl", path=str(docs), max_docs=0, cache_dir=tmp_path)
    with raises_config_error("data"):
        load_corpus("stdlib", max_docs=0)


def test_split_is_deterministic_and_disjoint(tmp_path):
    texts = numbered_docs(200)
    path = write_jsonl(tmp_path / "docs.jsonl", texts)
    first = load_corpus("jsonl", path=str(path), val_fraction=0.2, cache_dir=tmp_path / "a")
    second = load_corpus("jsonl", path=str(path), val_fraction=0.2, cache_dir=tmp_path / "b")
    train, val = split_texts(first)
    assert (train, val) == split_texts(second)
    assert not set(train) & set(val)
    assert sorted(train + val) == sorted(texts)
    assert 0.1 < len(val) / len(texts) < 0.3

    subset = load_corpus("jsonl", path=str(path), val_fraction=0.2, max_docs=50, cache_dir=tmp_path / "a")
    same = load_corpus("jsonl", path=str(path), val_fraction=0.2, max_docs=50, cache_dir=tmp_path / "b")
    assert subset.train.num_rows + subset.val.num_rows == 50
    assert split_texts(subset) == split_texts(same)


def test_stdlib_split_and_fingerprint_are_deterministic():
    first = load_corpus("stdlib", max_docs=30, val_fraction=0.2)
    second = load_corpus("stdlib", max_docs=30, val_fraction=0.2)
    train, val = split_texts(first)
    assert len(train) + len(val) == 30 and train and val
    assert not set(train) & set(val)
    assert (train, val) == split_texts(second)
    assert first.fingerprint == second.fingerprint
    assert load_corpus("stdlib", max_docs=31, val_fraction=0.2).fingerprint != first.fingerprint


def test_fingerprint_is_deterministic_and_tracks_content(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", numbered_docs(20))
    before = load_corpus("jsonl", path=str(path), cache_dir=tmp_path).fingerprint
    assert load_corpus("jsonl", path=str(path), cache_dir=tmp_path).fingerprint == before
    write_jsonl(path, numbered_docs(19) + ["a changed document"])
    changed = load_corpus("jsonl", path=str(path), cache_dir=tmp_path)
    assert changed.fingerprint != before
    assert "a changed document" in split_texts(changed)[0] + split_texts(changed)[1]  # no stale cache


# ------------------------------------------------------------------ DataModule


@pytest.fixture
def jsonl_corpus(tmp_path):
    texts = [f"def function_{i}(x):\n    return x * {i}  # naïve\n" * (1 + i % 3) for i in range(60)]
    return write_jsonl(tmp_path / "code.jsonl", texts)


def make_module(path, tmp_path, **overrides):
    options = dict(
        source="jsonl", path=str(path), seq_len=32, batch_size=4, val_fraction=0.2, cache_dir=str(tmp_path / "cache")
    )
    module = LMDataModule(**{**options, **overrides})
    module.setup("fit")
    return module


def test_max_train_rows_takes_the_first_training_rows_and_keeps_validation(jsonl_corpus, tmp_path):
    """A data curve cuts one corpus: the capped run trains on a prefix of the full one's rows, validates on the same."""
    full = make_module(jsonl_corpus, tmp_path, max_val_rows=3)
    capped = make_module(jsonl_corpus, tmp_path, max_val_rows=3, max_train_rows=5)
    assert len(full.train_rows) > 5 and len(capped.train_rows) == 5
    assert torch.equal(capped.train_rows.as_dict()["tokens"], full.train_rows.as_dict()["tokens"][:5])  # [5, S]
    assert torch.equal(capped.val_rows.as_dict()["tokens"], full.val_rows.as_dict()["tokens"])


def test_max_train_rows_is_refused_for_a_streamed_corpus(jsonl_corpus, tmp_path):
    with pytest.raises(ConfigError, match="data.max_train_rows"):
        make_module(jsonl_corpus, tmp_path, max_train_rows=5, streaming=True)


def first_batches(loader, n=3):
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == n:
            return batches
    return batches


def test_datamodule_batches_have_design_keys_and_shapes(jsonl_corpus, tmp_path):
    module = make_module(jsonl_corpus, tmp_path, max_val_rows=3)
    for loader in (module.train_dataloader(), module.val_dataloader()):
        batch = next(iter(loader))
        assert set(batch) == {"tokens", "active", "segment_ids", "position_ids"}
        assert batch["tokens"].dtype == batch["segment_ids"].dtype == batch["position_ids"].dtype == torch.long
        assert batch["active"].dtype == torch.bool
        assert all(value.shape[1] == 32 for value in batch.values())
        assert batch["tokens"].max() < module.vocab_size == 259
    assert all(batch["tokens"].shape == (4, 32) for batch in module.train_dataloader())  # drop_last
    assert len(module.val_rows) == 3
    assert torch.equal(next(iter(module.val_dataloader()))["tokens"], module.val_rows.as_dict()["tokens"])  # no shuffle

    stats = module.corpus_stats
    assert stats["n_docs_train"] + stats["n_docs_val"] == 60
    assert stats["n_tokens_train"] == stats["n_bytes_train"] + stats["n_docs_train"]  # bytes + one EOS each
    assert 0 < stats["unigram_bits_per_token"] < 8
    assert stats["unigram_nats_per_token"] == pytest.approx(stats["unigram_bits_per_token"] * np.log(2))
    assert len(module.corpus_fingerprint) == 64
    assert module.tokenizer_identity == {"kind": "byte", "vocab_size": 259}


def test_datamodule_order_is_deterministic_for_a_seed(jsonl_corpus, tmp_path):
    one = first_batches(make_module(jsonl_corpus, tmp_path, seed=3).train_dataloader())
    two = first_batches(make_module(jsonl_corpus, tmp_path, seed=3).train_dataloader())
    other = first_batches(make_module(jsonl_corpus, tmp_path, seed=4).train_dataloader())
    assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(one, two))
    assert not all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(one, other))


def test_datamodule_with_bpe(jsonl_corpus, tmp_path):
    module = make_module(jsonl_corpus, tmp_path, tokenizer="bpe", vocab_size=320)
    assert module.vocab_size == 320 and module.tokenizer_identity["kind"] == "bpe"
    batch = next(iter(module.train_dataloader()))
    assert batch["tokens"][batch["active"]].max() < 320
    assert (batch["tokens"][~batch["active"]] == module.tokenizer.pad_id).all()
    again = make_module(jsonl_corpus, tmp_path, tokenizer="bpe", vocab_size=320)
    assert again.tokenizer_identity == module.tokenizer_identity
    assert torch.equal(again.train_rows.as_dict()["tokens"], module.train_rows.as_dict()["tokens"])


def test_datamodule_on_stdlib_is_fast_enough_and_cached(tmp_path):
    module = LMDataModule(max_docs=20, seq_len=64, cache_dir=str(tmp_path))
    module.setup("fit")
    assert len(module.train_rows) >= 16 and module.corpus_stats["n_docs_train"] > 0
    assert list((tmp_path / "tokenized").glob("*.arrow"))


@pytest.mark.parametrize(
    "options, field",
    [
        (dict(tokenizer="sentencepiece"), "data.tokenizer"),
        (dict(tokenizer="bpe"), "data.vocab_size"),
        (dict(tokenizer="bpe", vocab_size=100), "data.vocab_size"),
        (dict(tokenizer="byte", vocab_size=512), "data.vocab_size"),
        (dict(source="csv"), "data.source"),
        (dict(source="text"), "data.path"),
        (dict(source="hub"), "data.name"),
        (dict(batch_size=0), "data.batch_size"),
        (dict(val_fraction=1.0), "data.val_fraction"),
        (dict(max_docs=-1), "data.max_docs"),
        (dict(seq_len="128"), "data.seq_len"),
    ],
)
def test_bad_config_fails_at_construction(options, field, tmp_path):
    with raises_config_error(field) as error:
        LMDataModule(cache_dir=str(tmp_path / "cache"), **options)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "cache").exists()


def test_unknown_option_and_default_agreement():
    with raises_config_error("data.seq_length") as error:
        validate_data_config(seq_length=64)
    assert "seq_length" in str(error.value)
    signature = inspect.signature(LMDataModule.__init__).parameters
    defaults = {f.name: f.default for f in dataclasses.fields(DataConfig)}
    assert {name: p.default for name, p in signature.items() if name != "self"} == defaults


def test_reading_results_before_setup_is_an_error():
    module = LMDataModule()
    assert module.vocab_size == 259  # known from the config alone
    with pytest.raises(RuntimeError, match="setup"):
        module.train_rows


# ------------------------------------------------------- sources as users name them


def write_formats(folder, texts):
    """The same documents in every local format the extension inference knows; name → (path, field, source)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({"content": t}) + "\n" for t in texts)
    (folder / "docs.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    with gzip.open(folder / "docs.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("\n".join(texts) + "\n")
    (folder / "docs.json").write_text(json.dumps([{"content": t} for t in texts]), encoding="utf-8")
    (folder / "docs.jsonl").write_text(lines, encoding="utf-8")
    with gzip.open(folder / "docs.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(lines)
    (folder / "docs.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode("utf-8")))
    datasets.Dataset.from_dict({"content": texts}).to_parquet(str(folder / "docs.parquet"))
    return {
        "docs.txt": ("text", "text"),
        "docs.txt.gz": ("text", "text"),
        "docs.json": ("json", "content"),
        "docs.jsonl": ("jsonl", "content"),
        "docs.jsonl.gz": ("jsonl", "content"),
        "docs.jsonl.zst": ("jsonl", "content"),
        "docs.parquet": ("parquet", "content"),
    }


def test_source_is_inferred_from_each_extension(tmp_path):
    texts = numbered_docs(30)
    formats = write_formats(tmp_path / "files", texts)
    for file, (source, field) in formats.items():
        path = str(tmp_path / "files" / file)
        config = validate_data_config(source="auto", path=path, text_field=field)
        assert config.source == source, file
        corpus = load_corpus("auto", path=path, text_field=field, val_fraction=0.3, cache_dir=tmp_path / "cache")
        assert corpus.source == source
        assert sorted(sum(split_texts(corpus), [])) == sorted(texts), file


def test_folders_globs_and_lists_of_one_format(tmp_path):
    shards = tmp_path / "shards"
    (shards / "part2").mkdir(parents=True)
    write_jsonl(shards / "a.jsonl", ["alpha one", "alpha two"])
    write_jsonl(shards / "part2" / "b.jsonl", ["beta one"])
    (shards / ".hidden.swp").write_text("editor junk")  # hidden files in a folder are skipped
    expected = ["alpha one", "alpha two", "beta one"]
    for path in (str(shards), str(shards / "**" / "*.jsonl"), [str(shards / "a.jsonl"), str(shards / "part2")]):
        corpus = load_corpus("auto", path=path, val_fraction=0.0, cache_dir=tmp_path / "cache")
        assert corpus.source == "jsonl"
        assert list(corpus.train["text"]) == expected, path  # file order, recursing into folders
    # Files are named relative to their common folder: a moved corpus keeps its fingerprint.
    moved = tmp_path / "elsewhere" / "shards"
    moved.parent.mkdir()
    shards.rename(moved)
    assert load_corpus("auto", path=str(moved), val_fraction=0.0, cache_dir=tmp_path / "c2").fingerprint == corpus.fingerprint


@pytest.mark.parametrize(
    "files, message",
    [
        (["a.parquet.gz"], "parquet compresses internally"),
        ([], "holds no files"),
    ],
)
def test_unusable_local_paths_fail_with_one_line(tmp_path, files, message):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in files:
        (folder / name).write_text('{"text": "x"}\n')
    with raises_config_error("data.path") as error:
        LMDataModule(source="auto", path=str(folder), cache_dir=str(tmp_path / "cache"))
    assert message in str(error.value) and "\n" not in str(error.value)
    with raises_config_error("data.path") as error:
        validate_data_config(source="auto", path=str(tmp_path / "nothing-*.jsonl"))
    assert "no file matches" in str(error.value)


def test_explicit_source_wins_over_the_extension(tmp_path):
    path = write_jsonl(tmp_path / "docs.jsonl", ["first", "second"])
    corpus = load_corpus("text", path=str(path), val_fraction=0.0, cache_dir=tmp_path / "cache")
    assert list(corpus.train["text"]) == path.read_text().splitlines()  # each JSON line read as text
    assert validate_data_config(source="text", path=str(path)).source == "text"


def test_hub_settings_name_the_data_and_enter_the_fingerprint():
    base = HubDataset(name="someone/corpus")
    settings = {"min_doc_chars": 1, "max_docs": None, "val_fraction": 0.05}
    variants = [
        base,
        HubDataset(name="someone/corpus", config_name="small"),
        HubDataset(name="someone/corpus", split="validation"),
        HubDataset(name="someone/corpus", revision="0123abcd"),
        HubDataset(name="someone/other"),
    ]
    prints = [hub_fingerprint(v, "text", settings) for v in variants]
    assert len(set(prints)) == len(prints)
    assert hub_fingerprint(HubDataset(name="someone/corpus"), "text", settings) == prints[0]
    assert hub_fingerprint(base, "content", settings) != prints[0]


@pytest.mark.parametrize("field, value", [("config_name", "small"), ("split", "validation"), ("revision", "main")])
def test_hub_only_settings_are_refused_for_other_sources(field, value):
    with raises_config_error(f"data.{field}") as error:
        validate_data_config(source="stdlib", **{field: value})
    assert "only for data.source=hub" in str(error.value)


def test_unreachable_hub_dataset_is_one_line_and_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # no network: datasets refuses before any request
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = lab_train("data=hub", "data.name=someone/not-cached-corpus", f"hydra.run.dir={tmp_path / 'run'}",
                       cache_dir=tmp_path / "cache", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: data.name: cannot reach Hub dataset 'someone/not-cached-corpus'"), lines[0]
    assert "HF_DATASETS_OFFLINE=1" in lines[0] and "data.path=" in lines[0]


def test_documented_local_corpus_example_runs_verbatim(tmp_path, cache_dir):
    page = (REPO / "docs" / "experiments.md").read_text(encoding="utf-8")
    command = next(line for line in page.splitlines() if line.startswith("lab-train data=text data.path=corpus.jsonl"))
    texts = [f"def f{i}(x):\n    return x + {i}  # naïve\n" * (1 + i % 4) for i in range(80)]
    write_jsonl(tmp_path / "corpus.jsonl", texts, field="content")
    overrides = shlex.split(command.split("#")[0])[1:]  # the documented line minus its comment, then a tiny model
    result = lab_train(*overrides, *TINY, "data.max_docs=null", f"hydra.run.dir={tmp_path / 'run'}",
                       cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    record = read_run(tmp_path / "run")
    assert record["status"] == "ok"
    assert record["config"]["data"]["source"] == "local" and record["manifest"]["tokenizer"]["kind"] == "bpe"
    assert record["corpus_stats"]["n_docs_train"] + record["corpus_stats"]["n_docs_val"] == 80


# ----------------------------------------------- memory-mapped rows, streaming rows


def reference_rows(module):
    """The previous implementation: the whole tokenized split flattened and packed in memory."""
    flat, lengths = token_stream(module.train_rows.stream.tokenized)
    return pack_stream(flat, lengths, module.config.seq_len, module.tokenizer.pad_id)


def loader_batches(rows, *, seed, batch_size, epochs, resume_step=0, shuffle=True, num_workers=0):
    """Batches as Lightning draws them: ResumableSampler, set_epoch per epoch, resume inside the first."""
    sampler = ResumableSampler(rows, seed=seed, batch_size=batch_size, shuffle=shuffle)
    first_epoch = resume_step // sampler.batches_per_epoch
    sampler.resume_at(resume_step)
    loader = torch.utils.data.DataLoader(
        rows, batch_size=batch_size, sampler=sampler, drop_last=True, num_workers=num_workers,
        generator=torch.Generator().manual_seed(seed),
    )
    batches = []
    for epoch in range(first_epoch, first_epoch + epochs):
        sampler.set_epoch(epoch)
        batches += list(loader)
    return batches


def assert_batches_equal(got, expected):
    assert len(got) == len(expected) > 0
    for index, (a, b) in enumerate(zip(got, expected)):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), (index, name)


@pytest.fixture(scope="module")
def stdlib_module(tmp_path_factory):
    """The stdlib corpus tokenized by two processes: two Arrow shards, so rows span chunk boundaries."""
    module = LMDataModule(max_docs=12, seq_len=64, batch_size=8, num_proc=2, cache_dir=str(tmp_path_factory.mktemp("c")))
    module.setup("fit")
    return module


def test_mapped_rows_equal_the_in_memory_rows_row_by_row(stdlib_module):
    rows, reference = stdlib_module.train_rows, reference_rows(stdlib_module)
    views, offsets = rows.stream.chunks()
    assert len(views) == 2 and all(v.dtype == np.uint16 for v in views)  # premise: two mapped uint16 shards
    assert len(rows) == len(reference) and len(rows) % 8 != 0  # the last batch of an epoch is partial
    straddling = int(np.searchsorted(np.arange(len(rows)) * 64, offsets[1])) - 1  # the row that crosses shards
    assert straddling * 64 < offsets[1] < (straddling + 1) * 64
    assert_batches_equal([rows[i] for i in range(len(rows))], [reference[i] for i in range(len(reference))])
    assert not rows[len(rows) - 1]["active"].all()  # the padded last row is there too


def test_mapped_batches_equal_the_previous_implementation_across_epochs_and_resume(stdlib_module):
    rows, reference = stdlib_module.train_rows, reference_rows(stdlib_module)
    per_epoch = len(rows) // 8
    for seed in (0, 5):
        assert_batches_equal(loader_batches(rows, seed=seed, batch_size=8, epochs=2),
                             loader_batches(reference, seed=seed, batch_size=8, epochs=2))
    resume = per_epoch + 3  # mid-way through the second epoch
    full = loader_batches(reference, seed=5, batch_size=8, epochs=3)
    assert_batches_equal(loader_batches(rows, seed=5, batch_size=8, epochs=2, resume_step=resume),
                         full[resume : 3 * per_epoch])
    # The loader the DataModule hands to Lightning draws the same batches, with workers too.
    assert_batches_equal(list(stdlib_module.train_dataloader()), loader_batches(reference, seed=0, batch_size=8, epochs=1))
    assert_batches_equal(loader_batches(rows, seed=0, batch_size=8, epochs=1, num_workers=2),
                         loader_batches(reference, seed=0, batch_size=8, epochs=1))


def test_mapped_rows_pickle_by_path_and_stats_match_the_stream(stdlib_module):
    rows = stdlib_module.train_rows
    blob = pickle.dumps(rows)
    assert len(blob) < rows.stream.n_tokens // 4  # the token stream is not in the pickle
    again = pickle.loads(blob)
    assert_batches_equal([again[i] for i in (0, 7, len(rows) - 1)], [rows[i] for i in (0, 7, len(rows) - 1)])
    stats, reference = stdlib_module.corpus_stats, reference_rows(stdlib_module)
    tokens = reference.tokens[reference.active].numpy()
    assert stats["n_tokens_train"] == tokens.size and stats["n_rows_train"] == len(reference)
    assert stats["unigram_bits_per_token"] == unigram_entropy_bits(tokens, 259)


def test_token_dtype_is_the_smallest_that_holds_the_vocabulary():
    assert [token_dtype(v) for v in (259, 4096, 65536, 65537, 200_000)] == ["uint16"] * 3 + ["uint32"] * 2
    assert tokenized_features(65537)["ids"].feature.dtype == "uint32"


def streaming_module(path, tmp_path, **overrides):
    options = dict(source="jsonl", path=str(path), seq_len=32, batch_size=4, val_fraction=0.2,
                   cache_dir=str(tmp_path / "cache"), shuffle=False, max_val_rows=5)
    module = LMDataModule(**{**options, **overrides})
    module.setup("fit")
    return module


def test_streaming_rows_equal_mapped_rows_with_the_shuffle_off(jsonl_corpus, tmp_path):
    mapped = streaming_module(jsonl_corpus, tmp_path)
    stream = streaming_module(jsonl_corpus, tmp_path, streaming=True)
    per_epoch = len(mapped.train_rows) // 4
    expected = loader_batches(mapped.train_rows, seed=0, batch_size=4, epochs=3, shuffle=False)
    got = list(itertools.islice(iter(stream.train_dataloader()), 3 * per_epoch))  # crosses two epoch ends
    assert_batches_equal(got, expected)
    assert_batches_equal(list(stream.val_dataloader()), list(mapped.val_dataloader()))
    assert stream.corpus_fingerprint == mapped.corpus_fingerprint
    # Resume by skipping: the stream continues with the batch the interrupted run would have drawn.
    resumed = stream.train_rows.resumed_at(per_epoch + 2)
    loader = torch.utils.data.DataLoader(resumed, batch_size=4)
    assert_batches_equal(list(itertools.islice(iter(loader), per_epoch)), expected[per_epoch + 2 : 2 * per_epoch + 2])
    workers = torch.utils.data.DataLoader(resumed, batch_size=4, num_workers=2)
    assert_batches_equal(list(itertools.islice(iter(workers), per_epoch)), expected[per_epoch + 2 : 2 * per_epoch + 2])


def test_streaming_stdlib_matches_mapped_and_shuffles_by_seed_and_epoch(tmp_path):
    options = dict(max_docs=30, seq_len=64, batch_size=4, cache_dir=str(tmp_path))
    mapped = LMDataModule(**options, shuffle=False)
    mapped.setup("fit")
    stream = LMDataModule(**options, shuffle=False, streaming=True)
    stream.setup("fit")
    n = 10
    assert_batches_equal(list(itertools.islice(iter(stream.train_dataloader()), n)), list(mapped.train_dataloader())[:n])

    def first_tokens(seed, epoch_batches=0):
        module = LMDataModule(**options, seed=seed, streaming=True, shuffle_buffer=8)
        module.setup("fit")
        batches = list(itertools.islice(iter(module.train_dataloader()), epoch_batches + n))
        return torch.cat([b["tokens"] for b in batches[epoch_batches:]])

    per_epoch = len(mapped.train_rows) // 4
    assert torch.equal(first_tokens(1), first_tokens(1))
    assert not torch.equal(first_tokens(1), first_tokens(2))
    assert not torch.equal(first_tokens(1), first_tokens(1, per_epoch))  # the next epoch is reshuffled


def test_streaming_training_resumes_exactly_and_matches_mapped_training(tmp_path, tiny_cfg):
    texts = [f"row {i}: " + "tok " * (3 + i % 5) for i in range(30)]
    corpus = write_jsonl(tmp_path / "small.jsonl", texts)
    base = ["data=text", f"data.path={corpus}", "data.max_docs=null", "data.shuffle=false", "data.val_fraction=0.1"]

    def final_weights(*overrides, run, steps, ckpt_path=None):
        _, module, datamodule = fit(tiny_cfg(*base, *overrides), tmp_path / run, max_steps=steps, every=4, ckpt_path=ckpt_path)
        return module.state_dict(), datamodule

    mapped, datamodule = final_weights(run="mapped", steps=9)
    per_epoch = len(datamodule.train_rows) // 4
    assert 4 < per_epoch < 9  # premise: the resume is mid-epoch 0, the run crosses into epoch 1
    streamed, _ = final_weights("data.streaming=true", run="stream", steps=9)
    final_weights("data.streaming=true", run="interrupted", steps=4)
    resumed, _ = final_weights("data.streaming=true", run="interrupted", steps=9,
                               ckpt_path=str(tmp_path / "interrupted" / "checkpoints" / "last.ckpt"))
    for key, tensor in mapped.items():
        assert torch.equal(streamed[key], tensor), key
        assert torch.equal(resumed[key], tensor), key


@pytest.mark.slow
def test_ddp_ranks_share_the_cache_and_streaming_matches_mapped(tmp_path):
    """Real 2-process DDP (gloo) through the CLI: rank 0 tokenizes, rank 1 reads its cache;
    with the shuffle off the streamed rows split over ranks exactly as the mapped rows."""
    texts = [f"row {i}: " + "tok " * (3 + i % 5) for i in range(60)]
    corpus = write_jsonl(tmp_path / "small.jsonl", texts)
    common = [*TINY, "trainer=ddp_cpu", "data=text", f"data.path={corpus}", "data.max_docs=null", "data.shuffle=false", "data.val_fraction=0.2",
              "trainer.max_steps=8", "callbacks.checkpoint.every_n_train_steps=8",
              "trainer.enable_progress_bar=true"]  # datasets' bars (counted below) follow the Trainer's switch
    finals = {}
    for name, extra in (("mapped", []), ("stream", ["data.streaming=true"])):
        cache = tmp_path / f"cache-{name}"
        run_dir = tmp_path / name
        result = lab_train(*common, *extra, f"hydra.run.dir={run_dir}", cache_dir=cache, cwd=tmp_path, timeout=SUBPROCESS_TIMEOUT)
        assert result.returncode == 0, result.stderr[-3000:]
        assert read_run(run_dir)["status"] == "ok"
        finals[name] = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        if name == "mapped":  # rank 0 tokenized each split once; rank 1 (its own process) read the cache
            bars = [line for line in result.stderr.replace("\r", "\n").splitlines() if line.startswith("tokenize:")]
            assert sum(line.startswith("tokenize:   0%") for line in bars) == 2, bars
            written = sorted(p.suffix for p in (cache / "tokenized").iterdir())
            assert written == [".arrow", ".arrow", ".json"], written
    for key, tensor in finals["mapped"].items():
        assert torch.equal(finals["stream"][key], tensor), key



def test_the_validation_unigram_cross_entropy_is_add_one_smoothed_nats_per_validation_token():
    import math

    import numpy as np

    from lab.data.datamodule import _unigram_cross_entropy

    train, val = np.array([3, 1, 0]), np.array([1, 0, 1])  # p = (3+1, 1+1, 0+1) / (4 + 3) = 4/7, 2/7, 1/7
    assert _unigram_cross_entropy(val, train) == pytest.approx(-(math.log(4 / 7) + math.log(1 / 7)) / 2, rel=1e-12)
    assert math.isnan(_unigram_cross_entropy(np.zeros(3, dtype=np.int64), train))

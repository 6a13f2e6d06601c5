"""Data pipeline: sources, tokenizers, packing and the DataModule, with real `datasets`."""

from __future__ import annotations

import dataclasses
import inspect
import json

import datasets
import numpy as np
import pytest
import torch

from lab.data import (
    BPETokenizer,
    ByteTokenizer,
    DataConfig,
    LMDataModule,
    build_tokenizer,
    load_corpus,
    pack_documents,
    pack_tokenized,
    tokenize_documents,
    unigram_entropy_bits,
    validate_data_config,
)
from lab.data.tokenizers import bpe_cache_path
from lab.errors import ConfigError

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
    assert torch.equal(next(iter(module.val_dataloader()))["tokens"], module.val_rows.tokens[:3])  # no shuffle

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
    assert torch.equal(again.train_rows.tokens, module.train_rows.tokens)


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
    with raises_config_error("data") as error:
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

"""A folder of your own files as a corpus (data.source=files, and what data.path selects when data.source is left alone)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lab.data.config import validate_data_config
from lab.data.corpus_split import split_bucket
from lab.data.sources import load_corpus
from lab.errors import ConfigError
from tests.cli import TINY, lab_train_in_process

CODE = {f"pkg/mod{i}.py": f"def f{i}(x):\n    return x * {i} + {i * i}\n" for i in range(12)}


def write_folder(root: Path, files: dict[str, bytes | str]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return root


@pytest.fixture
def code(tmp_path) -> Path:
    return write_folder(tmp_path / "code", {**CODE, "README": "notes without an extension\n", "logo.png": b"\x89PNG\x00\x01\x02",
                                            "latin1.txt": "café".encode("latin-1")})


def texts(dataset) -> list[str]:
    return list(dataset["text"])


def test_a_folder_is_one_document_per_utf8_file_and_skips_the_others_with_a_count(code, capsys):
    config = validate_data_config(path=str(code))  # data.source left alone
    assert config.source == "files"
    corpus = load_corpus(config.source, path=config.path, val_fraction=0.2)
    documents = texts(corpus.train) + texts(corpus.val)
    assert sorted(documents) == sorted([*CODE.values(), "notes without an extension\n"])  # whole files, the README included
    assert "13 documents from 15 files; skipped 2 that are not UTF-8 text" in capsys.readouterr().err


def test_the_split_is_the_path_hash_of_the_stdlib_corpus(code):
    corpus = load_corpus("files", path=str(code), include=["*.py"], val_fraction=0.2)
    by_text = {text: name for name, text in CODE.items()}
    val = {by_text[t] for t in texts(corpus.val)}
    assert val == {name for name in CODE if split_bucket(name) < 200}  # the key is the path relative to the folder


def test_include_and_exclude_filter_paths_relative_to_the_folder(code):
    kept = load_corpus("files", path=str(code), include=["pkg/*"], exclude=["*mod1*.py"], val_fraction=0.0)
    assert sorted(texts(kept.train)) == sorted(text for name, text in CODE.items() if not Path(name).stem.startswith("mod1"))


def test_the_fingerprint_follows_the_bytes_not_the_folders_place(code, tmp_path):
    first = load_corpus("files", path=str(code)).fingerprint
    moved = shutil.copytree(code, tmp_path / "elsewhere" / "code")
    assert load_corpus("files", path=str(moved)).fingerprint == first
    (moved / "pkg" / "mod3.py").write_text("def changed():\n    pass\n")
    assert load_corpus("files", path=str(moved)).fingerprint != first


@pytest.mark.parametrize("options, field, words", [
    ({"source": "stdlib", "path": "{code}"}, "data.path", "data.source=stdlib reads no local files"),
    ({"path": "{empty}"}, "data.path", "holds no files"),
    ({"path": "{code}", "include": ["*.rs"]}, "data.include", "no file of data.path is left"),
    ({"path": "{code}", "source": "jsonl", "include": ["*.py"]}, "data.include", "data.source=jsonl reads records"),
])
def test_contradicting_or_empty_folder_settings_are_refused_in_one_line(code, tmp_path, options, field, words):
    (tmp_path / "empty").mkdir()
    options = {k: v.format(code=code, empty=tmp_path / "empty") if isinstance(v, str) else v for k, v in options.items()}
    with pytest.raises(ConfigError, match=words) as error:
        validate_data_config(**options)
    assert error.value.field == field


def test_a_folder_of_binary_files_is_refused(tmp_path):
    folder = write_folder(tmp_path / "bin", {"a.bin": b"\x00\x01", "b.bin": b"\xff\xfe\x00"})
    with pytest.raises(ConfigError, match="none of its 2 files is UTF-8 text"):
        load_corpus("auto", path=str(folder))


def test_lab_train_with_data_path_trains_on_that_folder(code, tmp_path, cache_dir):
    run = tmp_path / "run"
    overrides = [o for o in TINY if not o.startswith("data.max_docs")]
    result = lab_train_in_process(*overrides, f"data.path={code}", "data.val_fraction=0.2", "callbacks.decoding=null",
                                  f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    stats = json.loads((run / "run.json").read_text())["corpus_stats"]
    assert stats["n_docs_train"] + stats["n_docs_val"] == 13  # the folder's documents, not the stdlib's 400

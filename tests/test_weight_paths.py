"""One weight check on every path that reads weights (issue 70): each kind of weight source × each damage the
kind can hold, on each path that reads it, is refused in one line naming the tensor and the file.

The kinds are a training checkpoint, the harness's own release, every release layout the registry holds
(lab/release/: `release_layouts()`), a `model=hf` folder and a GGUF file. A layout's paths come from its registry
entry (`load`: lab-generate DIR; `init_from`: the pre-flight check and its reader), so a new layout is covered by
giving it a maker in LAYOUT_MAKERS (test_every_registered_layout_has_a_maker fails until it has one). The damages:
NaN, inf, int8 and float8 (a cast without scales); a GGUF has no float8 type and its quantised types carry their scales,
so it takes NaN, inf and int8 (I8). Each case was seen to fail with the check on its path removed.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lab.data.tokenizers import ByteTokenizer
from lab.errors import ConfigError
from lab.release import release_layouts
from tests.cli import TINY, lab_train_in_process, one_error_line

pytestmark = pytest.mark.usefixtures("single_thread")


def with_value(value: float):
    def damage(tensor: torch.Tensor) -> torch.Tensor:
        damaged = tensor.clone()
        damaged.view(-1)[3] = value
        return damaged
    return damage


DAMAGES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "nan": (with_value(float("nan")), "holds 1 non-finite value (NaN or inf)"),
    "inf": (with_value(float("inf")), "holds 1 non-finite value (NaN or inf)"),
    "int8": (lambda tensor: tensor.to(torch.int8), "is stored as int8"),
    "float8": (lambda tensor: tensor.to(torch.float8_e4m3fn), "is stored as float8_e4m3fn"),
}


# ------------------------------------------------------------------------ clean sources, each written once


def tiny_gpt():
    from lab.model.mtp import build_model

    torch.manual_seed(0)
    return build_model({"vocab_size": ByteTokenizer.vocab_size, "d_model": 16, "n_layers": 2, "n_heads": 2},
                       {"name": "parallel", "k": 2, "compute_match": "none"})


def write_checkpoint(folder: Path) -> Path:
    from lab.checkpoint import plain

    folder.mkdir(parents=True)
    model = tiny_gpt()
    manifest = {"model": plain(model.model_cfg), "tokenizer": {}, "head": "parallel"}  # what init_from reads of it
    torch.save({"state_dict": {f"model.{key}": value for key, value in model.state_dict().items()}, "mtp_manifest": manifest},
               folder / "last.ckpt")
    return folder / "last.ckpt"


def write_lab_release(folder: Path) -> Path:
    from lab.checkpoint import plain
    from lab.release.export import write_release

    model = tiny_gpt()
    config = {"format": 1, "model": plain(model.model_cfg), "head": plain(model.head_cfg), "tokenizer": ByteTokenizer().identity}
    write_release(folder, {key: value.contiguous() for key, value in model.state_dict().items()}, config, {}, None)
    return folder


def write_hf(folder: Path) -> Path:
    from tests.hf_fixtures import write_llama

    return write_llama(folder)  # with its tokenizer: a run reads it


def write_deepseek(folder: Path) -> Path:
    from tests.deepseek_fixtures import write_deepseek_release

    return write_deepseek_release(folder, depth=1)


def write_medusa(folder: Path) -> Path:
    """A Medusa folder pointing at a base folder beside it (the heads as a frozen run on model.path would export them)."""
    from lab.model.mtp import build_model
    from lab.release.medusa import export_medusa
    from tests.hf_fixtures import write_llama

    base = write_llama(folder.parent / f"{folder.name}-base")
    torch.manual_seed(0)
    model = build_model({"name": "hf", "path": str(base)},
                        {"name": "medusa", "k": 3, "n_layers": 1, "unembedding": "replicated", "trunk_grad": "frozen"})
    export_medusa({}, folder, model)  # points at the base: the checkpoint is not read
    return folder


# A maker for every release layout the registry holds (its name → a clean folder, and the tensor to damage).
LAYOUT_MAKERS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "deepseek": (write_deepseek, "model.layers.2.eh_proj.weight"),  # an MTP layer: its own loader reads it
    "medusa": (write_medusa, "blocks.0.layers.0.weight"),
}


# ------------------------------------------------------------------------ the paths that read each kind


@dataclass(frozen=True)
class Kind:
    make: Callable[[Path], Path]  # a clean source
    tensor: str  # the tensor the damage goes into
    readers: dict[str, Callable[[Path], object]]  # path name → read the source as that path does
    damages: tuple[str, ...] = tuple(DAMAGES)


def init_from_preflight(prefix: str = "") -> Callable[[Path], object]:
    from lab.release.init_from import check_parent

    return lambda source: check_parent(f"{prefix}{source}")


def init_from_build(source: Path):
    """What the build reads for init_from (a sweep job's path: no pre-flight), into a model it does not load into."""
    from lab.release.init_from import parent_files, parent_weights

    kind, path = parent_files(str(source))
    return parent_weights(kind, path, None)


def verdict(check: Callable[[str], int]) -> Callable[[Path], object]:
    """`lab-export --check DIR` as a reader: its FAIL line (the loader's refusal) raised as the ConfigError it printed."""
    def read(folder: Path) -> None:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = check(str(folder))
        if code != 0:
            raise ConfigError("--check", " | ".join(line for line in out.getvalue().splitlines() if "FAIL" in line))
    return read


def load_hf(folder: Path):
    from lab.model.hf_trunk import HFModelConfig, load_hf_model

    return load_hf_model(HFModelConfig(path=str(folder)))


def layout_kind(name: str) -> Kind:
    """A registered layout's paths, from its registry entry."""
    layout = release_layouts()[name]
    readers: dict[str, Callable[[Path], object]] = {}
    if layout.load is not None:
        readers["lab-generate"] = layout.load
    if layout.init_from is not None:
        reader = layout.init_from
        readers["init_from pre-flight"] = init_from_preflight(reader.prefix or "")
        readers["init_from build"] = lambda folder: reader.read(folder, SimpleNamespace(head=None, head_cfg=None))
    if layout.check is not None:
        readers["lab-export --check"] = verdict(layout.check)
    return Kind(LAYOUT_MAKERS[name][0], LAYOUT_MAKERS[name][1], readers)


def own_kinds() -> dict[str, Kind]:
    from lab.checkpoint import load_checkpoint
    from lab.release.export import check_folder, load_release

    return {
        "checkpoint": Kind(write_checkpoint, "model.trunk.blocks.0.mlp.up.weight",
                           {"init_from pre-flight": init_from_preflight(), "init_from build": init_from_build,
                            "ckpt_path / lab-generate / lab-export": load_checkpoint}),
        "release": Kind(write_lab_release, "trunk.blocks.0.mlp.up.weight",
                        {"init_from pre-flight": init_from_preflight(), "init_from build": init_from_build, "lab-generate": load_release,
                         "lab-export --check": verdict(check_folder)}),
        "hf": Kind(write_hf, "model.layers.0.mlp.up_proj.weight", {"model=hf model.path": load_hf}),
    }


def kinds() -> dict[str, Kind]:
    return {**own_kinds(), **{name: layout_kind(name) for name in release_layouts() if name in LAYOUT_MAKERS}}


CASES = [(kind, reader, damage) for kind, spec in kinds().items() for reader in spec.readers for damage in spec.damages]


@pytest.mark.parametrize("name", sorted(release_layouts()))
def test_every_registered_layout_has_a_maker(name):
    assert name in LAYOUT_MAKERS, f"release layout '{name}' has no maker in LAYOUT_MAKERS: its load paths are not covered here"


# ------------------------------------------------------------------------ damaging a source


def damage_source(source: Path, tensor: str, damage: str) -> Path:
    """The file holding `tensor`, rewritten with the damage."""
    from lab.model.hf_weights import weight_files
    from safetensors.torch import load_file, save_file

    edit = DAMAGES[damage][0]
    if source.is_file():  # a checkpoint
        checkpoint = torch.load(source, weights_only=True)
        checkpoint["state_dict"][tensor] = edit(checkpoint["state_dict"][tensor])
        torch.save(checkpoint, source)
        return source
    file = source / weight_files(source)[tensor]
    tensors = load_file(file)
    tensors[tensor] = edit(tensors[tensor])
    save_file(tensors, file, metadata={"format": "pt"})
    return file


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """kind → a clean source, written once for the module."""
    root = tmp_path_factory.mktemp("clean")
    return {name: spec.make(root / name) for name, spec in kinds().items()}


def copy_of(source: Path, into: Path) -> Path:
    if source.is_file():
        into.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(source, into / source.name))
    return Path(shutil.copytree(source, into / source.name))


def assert_one_line_naming(error: ConfigError, tensor: str, file: Path, words: str) -> None:
    line = str(error)
    assert "\n" not in line and tensor in line and words in line, line
    assert str(file) in line or (file.name in line and str(file.parent) in line), line  # the file (or its folder and name)


@pytest.mark.parametrize(("kind", "reader", "damage"), CASES, ids=["-".join(case) for case in CASES])
def test_every_path_refuses_each_damage_naming_tensor_and_file(clean, tmp_path, kind, reader, damage):
    spec = kinds()[kind]
    source = copy_of(clean[kind], tmp_path)
    file = damage_source(source, spec.tensor, damage)
    with pytest.raises(ConfigError) as refused:
        spec.readers[reader](source)
    assert_one_line_naming(refused.value, spec.tensor, file, DAMAGES[damage][1])


@pytest.mark.parametrize("kind", sorted(kinds()))
def test_a_clean_source_passes_every_path(clean, kind):
    """The refusals above come from the damage, not from the source: the clean one reads on every path."""
    refused = {}
    for name, read in kinds()[kind].readers.items():
        try:
            read(clean[kind])
        except ConfigError as error:
            refused[name] = str(error)
    assert refused == {}, refused


def test_a_medusa_parent_whose_base_is_damaged_is_refused_before_the_run(clean, tmp_path):
    """init_from of a Medusa folder reads its base too: the pre-flight checks the folder the pointer names."""
    folder = copy_of(clean["medusa"], tmp_path / "heads")
    base = Path(shutil.copytree(clean["medusa"].parent / "medusa-base", tmp_path / "heads" / "medusa-base"))
    config = json.loads((folder / "config.json").read_text())
    config["base_model"]["path"] = str(base)
    (folder / "config.json").write_text(json.dumps(config))
    file = damage_source(base, "model.layers.0.mlp.up_proj.weight", "nan")
    with pytest.raises(ConfigError) as refused:
        init_from_preflight()(folder)
    assert_one_line_naming(refused.value, "model.layers.0.mlp.up_proj.weight", file, DAMAGES["nan"][1])


# A GGUF has no float8 type, and its quantised types carry their scales: NaN, inf, and int8 (I8: integers, no scales).
GGUF_DAMAGES = {
    "nan": (lambda values: np_with(values, float("nan")), "model.layers.0.mlp.up_proj.weight", DAMAGES["nan"][1]),
    "inf": (lambda values: np_with(values, float("inf")), "model.layers.0.mlp.up_proj.weight", DAMAGES["inf"][1]),
    "int8": (lambda values: (values * 100).astype("int8"), "blk.0.ffn_up.weight", "stores tensors as I8"),
}


def np_with(values, value: float):
    values.reshape(-1)[3] = value
    return values


@pytest.mark.parametrize("damage", sorted(GGUF_DAMAGES))
def test_a_gguf_is_refused_before_its_cache_entry_is_written(tmp_path, damage):
    """model=hf model.path=<file>.gguf (pre-flight converts it): an int8 tensor is refused from the file's table, NaN / inf
    in the dequantised tensors (named as transformers names them) before the cache holds them."""
    from lab.model.gguf_source import converted_folder
    from tests.gguf_fixtures import write_llama_gguf

    edit, tensor, words = GGUF_DAMAGES[damage]
    file = write_llama_gguf(tmp_path / "tiny.gguf", edit=lambda name, values: edit(values) if name == "blk.0.ffn_up.weight" else values)
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError) as refused:
        converted_folder(file, "model.path", cache)
    assert_one_line_naming(refused.value, tensor, file, words)
    assert not cache.exists() or not [entry for entry in cache.iterdir() if entry.is_dir()], list(cache.iterdir())  # nothing half-written


def inconsistent(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["model"]["d_model"] = 32
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(("what", "words"), [("nan", "holds"), ("config", "does not fit its config.json")])
def test_lab_train_init_from_a_damaged_release_is_one_line_exit_2_and_makes_no_run_folder(clean, tmp_path, cache_dir, monkeypatch,
                                                                                          what, words):
    """The issue's case: a release with NaN weights trained into `FloatingPointError: non-finite loss at step 0`, and one
    whose config.json disagrees with its tensors trained; both are refused before Hydra starts (and makes the run folder).
    A refusal at build would look the same from outside (the new run folder is removed again), so Hydra may not start."""
    import lab.train

    def hydra_started():
        raise AssertionError("Hydra started: the refusal came after the run folder was made")

    monkeypatch.setattr(lab.train, "hydra_main", hydra_started)
    release = copy_of(clean["release"], tmp_path)
    if what == "nan":
        for key in ("trunk.embed.weight", "trunk.blocks.0.mlp.up.weight"):
            damage_source(release, key, "nan")
    else:
        inconsistent(release)
    result = lab_train_in_process(*TINY, f"init_from={release}", f"hydra.run.dir={tmp_path / 'run'}",
                                  cache_dir=cache_dir, cwd=tmp_path)
    line = one_error_line(result)
    assert line.startswith("error: release: ") and words in line, line
    assert not (tmp_path / "run").exists()


def test_lab_train_on_a_damaged_model_hf_folder_is_one_line_exit_2_and_leaves_no_run_folder(clean, tmp_path, cache_dir):
    """model=hf model.path=DIR: the weights are checked as the trunk loads them, after Hydra made the run folder (pre-flight
    reads no weights: a second full read of the model on every start); the refused first attempt removes that folder."""
    folder = copy_of(clean["hf"], tmp_path)
    damage_source(folder, "model.layers.0.mlp.up_proj.weight", "nan")
    not_model = [override for override in TINY if not override.startswith("model.")]
    result = lab_train_in_process(*not_model, "model=hf", f"model.path={folder}", f"hydra.run.dir={tmp_path / 'run'}",
                                  cache_dir=cache_dir, cwd=tmp_path)
    line = one_error_line(result)
    assert line.startswith("error: model.path: ") and "tensor model.layers.0.mlp.up_proj.weight holds 1 non-finite value" in line, line
    assert not (tmp_path / "run").exists()

"""One weight check on every path that loads weights (lab/model/weight_check.py; every kind × path: test_weight_paths.py) and one line for every damaged
release (issue 56): each damage below, on each path, ends with one `error:` line naming what is wrong, exit 2.

Damages of a checkpoint (its content digest removed, as in a checkpoint from before digests or an edited one):
a weight cast to int8 or float8 without scales, NaN in a weight. Paths: `lab-generate`, `lab-export`,
`lab-train ckpt_path=…` (resume) and `lab-train init_from=…`. Damages of a release folder: those three, a
truncated model.safetensors, a config.json that is not JSON, a tensor of the wrong shape, a config whose model
does not match the tensors.
"""

from __future__ import annotations

import json

import pytest
import torch

from lab.release.export import export
from tests.cli import TINY, command_in_process, lab_train, lab_train_in_process

WEIGHT = "model.trunk.blocks.0.mlp.up.weight"


def quantised_int8(tensor):
    return tensor.to(torch.int8)


def quantised_float8(tensor):
    return tensor.to(torch.float8_e4m3fn)


def with_nan(tensor):
    damaged = tensor.clone()
    damaged.view(-1)[3] = float("nan")
    return damaged


DAMAGES = {"int8": (quantised_int8, "is stored as int8, a quantised dtype"), "float8": (quantised_float8, "is stored as float8_e4m3fn"),
           "nan": (with_nan, "holds 1 non-finite value (NaN or inf)")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_dir):
    root = tmp_path_factory.mktemp("weights")
    result = lab_train(*TINY, "head=parallel", "head.k=2", "callbacks.decoding=null", f"hydra.run.dir={root / 'run'}", cache_dir=cache_dir, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "run" / "checkpoints" / "last.ckpt"


def damaged_checkpoint(ckpt, tmp_path, damage) -> str:
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["state_dict"][WEIGHT] = DAMAGES[damage][0](checkpoint["state_dict"][WEIGHT])
    checkpoint.pop("mtp_digest", None)
    path = tmp_path / "damaged.ckpt"
    torch.save(checkpoint, path)
    return str(path)


def one_error_line(result) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return errors[0]


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("path", ["lab-generate", "lab-export", "ckpt_path", "init_from"])
def test_a_damaged_checkpoint_is_refused_on_every_path_naming_the_tensor(trained, tmp_path, cache_dir, damage, path):
    ckpt = damaged_checkpoint(trained, tmp_path, damage)
    if path == "lab-generate":
        result = command_in_process("lab-generate", ckpt, "--prompt", "def f(", "--max-new-tokens", "4")
    elif path == "lab-export":
        result = command_in_process("lab-export", ckpt, "--out", str(tmp_path / "release"))
    else:
        extra = [f"ckpt_path={ckpt}"] if path == "ckpt_path" else ["head.trunk_grad=frozen", f"init_from={ckpt}"]
        result = lab_train_in_process(*TINY, "head=parallel", "head.k=2", *extra, f"hydra.run.dir={tmp_path / 'run'}", cache_dir=cache_dir, cwd=tmp_path)
    line = one_error_line(result)
    assert f"tensor {WEIGHT} {DAMAGES[damage][1]}" in line, line
    assert not (tmp_path / "release").exists()


def release_damages():
    def tensors_edit(edit):
        def apply(folder):
            from safetensors.torch import load_file, save_file

            tensors = load_file(folder / "model.safetensors")
            edit(tensors)
            save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        return apply

    def truncate(folder):
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])

    def not_json(folder):
        (folder / "config.json").write_text("{ this is not json")

    def wrong_shape(tensors):
        tensors["trunk.blocks.0.mlp.up.weight"] = tensors["trunk.blocks.0.mlp.up.weight"][:, :-1].contiguous()

    def other_config(folder):
        config = json.loads((folder / "config.json").read_text())
        config["model"]["d_model"] = 64
        (folder / "config.json").write_text(json.dumps(config))

    def all_nan(tensors):
        for key in tensors:
            if tensors[key].is_floating_point():
                tensors[key] = torch.full_like(tensors[key], float("nan"))

    return {
        "truncated safetensors": (truncate, "model.safetensors is truncated or not a safetensors file"),
        "config not JSON": (not_json, "config.json is not readable JSON"),
        "tensor of the wrong shape": (tensors_edit(wrong_shape), "tensor trunk.blocks.0.mlp.up.weight has shape"),
        "config not matching the tensors": (other_config, "does not fit its config.json"),
        "all NaN": (tensors_edit(all_nan), "non-finite values (NaN or inf)"),
    }


@pytest.mark.parametrize("damage", sorted(release_damages()))
def test_a_damaged_release_is_one_line_naming_its_defect(trained, tmp_path, damage):
    folder = tmp_path / "release"
    export(trained, folder)
    edit, words = release_damages()[damage]
    edit(folder)
    line = one_error_line(command_in_process("lab-generate", str(folder), "--prompt", "def f(", "--max-new-tokens", "4"))
    assert line.startswith("error: release: ") and words in line, line


def test_lab_export_check_passes_its_own_release_and_names_each_defect(trained, tmp_path):
    """Issue 56: `--check` on any own-format release said `num_hidden_layers: config.json needs the main layer count`."""
    folder = tmp_path / "release"
    export(trained, folder)
    passed = command_in_process("lab-export", "--check", str(folder))
    assert passed.returncode == 0 and "lab release: PASS" in passed.stdout, passed.stdout + passed.stderr
    for damage, (edit, words) in release_damages().items():
        damaged = tmp_path / damage.replace(" ", "_")
        export(trained, damaged)
        edit(damaged)
        result = command_in_process("lab-export", "--check", str(damaged))
        assert result.returncode == 1 and "lab release: FAIL (release: " in result.stdout and words in result.stdout, (damage, result.stdout)

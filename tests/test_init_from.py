"""Two-stage training: `init_from` (weights only) and `head.trunk_grad=frozen`.

Real parts: conf/ composed by Hydra, `lab.train.build`, a real Lightning Trainer, the real
`lab-train` CLI for the refusal, `lab-export` for a release parent.
"""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch

from lab.errors import ConfigError
from lab.release.export import export, sha256_file
from lab.train import build
from tests.cli import SUBPROCESS_TIMEOUT, TINY, lab_train, lab_train_in_process
from tests.fit_helpers import fit

FROZEN = ("head=parallel", "head.k=3", "head.compute_match=none", "head.trunk_grad=frozen")


def is_trunk(name: str) -> bool:
    return name.startswith("model.trunk.")


class InitialWeights(pl.Callback):
    """The module's Parameters as training starts, and the optimizer it trains with."""

    def on_train_start(self, trainer, pl_module):
        self.weights = {n: p.detach().clone() for n, p in pl_module.named_parameters()}
        self.optimizer = trainer.optimizers[0]


@pytest.fixture
def parent(tiny_cfg, tmp_path):
    """A 4-step ntp run's last checkpoint (the first stage)."""
    fit(tiny_cfg("head=ntp", "model.n_layers=2"), tmp_path / "parent", max_steps=4, every=4)
    return tmp_path / "parent" / "checkpoints" / "last.ckpt"


def test_frozen_trunk_is_bitwise_unchanged_after_10_steps_and_not_in_the_optimizer(tiny_cfg, tmp_path):
    start = InitialWeights()
    _, module, _ = fit(tiny_cfg(*FROZEN, "trainer.max_steps=10"), tmp_path / "run", max_steps=10, every=10, callbacks=[start])
    after = dict(module.named_parameters())
    trunk = [n for n in after if is_trunk(n)]
    assert trunk and all(not after[n].requires_grad for n in trunk)
    assert all(torch.equal(after[n], start.weights[n]) for n in trunk)  # trunk, embedding, final norm, unembedding
    assert all(not torch.equal(after[n], start.weights[n]) for n in after if n.startswith("model.head.") and n.endswith("up.weight"))
    bound = {id(p) for group in start.optimizer.param_groups for p in group["params"]}
    assert bound == {id(p) for n, p in after.items() if not is_trunk(n)}
    assert not any(id(after[n]) in {id(p) for p in start.optimizer.state} for n in trunk)


def test_init_from_loads_the_parent_trunk_and_records_its_sha256(tiny_cfg, tmp_path, parent):
    state = torch.load(parent, weights_only=True)["state_dict"]
    _, module = build(tiny_cfg(*FROZEN, "model.n_layers=2", f"init_from={parent}"))
    own = module.state_dict()
    assert all(torch.equal(own[key], value) for key, value in state.items())  # every parent weight, trunk included
    assert module.init_from == {"source": str(parent.resolve()), "kind": "checkpoint", "sha256": sha256_file(parent)}
    # then trained: the frozen trunk stays the parent's
    _, trained, _ = fit(tiny_cfg(*FROZEN, "model.n_layers=2", f"init_from={parent}"), tmp_path / "child", max_steps=3, every=3)
    assert all(torch.equal(trained.state_dict()[key], value) for key, value in state.items() if key.startswith("model.trunk."))
    manifest = torch.load(tmp_path / "child" / "checkpoints" / "last.ckpt", weights_only=True)["mtp_manifest"]
    assert manifest["init_from"]["sha256"] == sha256_file(parent)


def test_init_from_a_release_dir(tiny_cfg, tmp_path, parent):
    export(parent, tmp_path / "release")
    _, module = build(tiny_cfg(*FROZEN, "model.n_layers=2", f"init_from={tmp_path / 'release'}"))
    assert module.init_from["kind"] == "release"
    assert module.init_from["sha256"] == sha256_file(tmp_path / "release" / "model.safetensors")


def test_init_from_refuses_a_parent_of_another_shape(tiny_cfg, parent):
    with pytest.raises(ConfigError, match=r"^init_from: model\.trunk\.|^init_from: trunk\.") as error:
        build(tiny_cfg(*FROZEN, "model.n_layers=2", "model.d_model=48", f"init_from={parent}"))
    assert "has shape" in str(error.value)
    with pytest.raises(ConfigError, match=r"^init_from: the parent has no trunk\.blocks\.2"):
        build(tiny_cfg(*FROZEN, "model.n_layers=3", f"init_from={parent}"))


def test_init_from_with_another_vocabulary_is_one_line_exit_2_through_the_cli(tmp_path, cache_dir, parent):
    run_dir = tmp_path / "child"
    result = lab_train_in_process(*TINY, *FROZEN, "model.n_layers=2", "model.vocab_size=300", f"init_from={parent}",
                                  f"hydra.run.dir={run_dir}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: init_from: vocab_size differs: the parent has "), result.stderr[-2000:]
    assert "300" in lines[0]
    assert not (run_dir / "checkpoints").exists()


def test_init_from_a_missing_path_is_refused_before_the_run(tmp_path, cache_dir):
    result = lab_train_in_process(*TINY, f"init_from={tmp_path / 'nowhere'}", f"hydra.run.dir={tmp_path / 'run'}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith("error: init_from: no checkpoint")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_draft_training_second_stage_runs_as_one_sweep(tmp_path, cache_dir, parent):
    """experiments/draft_training.yaml step 2 on a tiny parent: 3 jobs, the frozen ones keep the parent's trunk."""
    import csv
    import json

    sweep = tmp_path / "sweep"
    result = lab_train("-m", "experiment=draft_training", *TINY, "model.n_layers=2", f"parent={parent.parent.parent}",
                       f"hydra.sweep.dir={sweep}", "callbacks.decoding.new_tokens=8", cache_dir=cache_dir, cwd=tmp_path, timeout=SUBPROCESS_TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {row["overrides"]: row for row in csv.DictReader((sweep / "runs.csv").open())}
    assert [row["status"] for row in rows.values()] == ["ok"] * 3
    assert all(row["val/agree/h2"] and row["decode/tokens_per_forward"] for row in rows.values())
    parent_state = torch.load(parent, weights_only=True)["state_dict"]
    for job in sorted(p for p in sweep.iterdir() if (p / "run.json").exists()):
        manifest = json.loads((job / "run.json").read_text())["manifest"]
        state = torch.load(job / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
        same_trunk = all(torch.equal(state[key], value) for key, value in parent_state.items())
        frozen = manifest["head_config"]["trunk_grad"] == "frozen"
        assert same_trunk == frozen and (manifest["init_from"] is not None) == frozen
        if frozen:
            assert manifest["init_from"]["sha256"] == sha256_file(parent)


def test_a_frozen_trunk_needs_a_head_with_parameters():
    from lab.model.mtp import build_model

    with pytest.raises(ConfigError, match=r"^head\.trunk_grad: frozen leaves head=identity nothing to train"):
        build_model({"vocab_size": 13, "d_model": 16, "n_heads": 2}, {"name": "identity", "k": 2, "trunk_grad": "frozen"})

"""Chaos: a random bad-config generator. Every typed field of every config group is mutated with a
wrong type, a wrong sign and an out-of-range value; each mutation must either train or be refused
in one line naming a field, before any folder exists — never end in another exception (a traceback).

The checks are `lab-train`'s own, in process: `preflight` (what runs before Hydra makes the run
folder), then `build` (data and model; what runs before the first attempt is accepted), then a
one-step fit of what passed. A diverging value may end that step with the harness's non-finite-loss
stop (FloatingPointError: one line in the CLI, recorded `failed`). The mutations are drawn at random
from all of them (MTP_LAB_MUTATIONS=all runs every one; MTP_LAB_MUTATION_SEED replays a draw).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import hydra
import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from lab.config.preflight import compose, preflight
from lab.errors import ConfigError
from lab.train import CONF_DIR
from tests.cli import TINY

GROUPS = ("model", "head", "data", "optim", "trainer", "reduction", "weights", "schedule", "callbacks.checkpoint")
SAMPLE = 40  # mutations per run (of several hundred): a few minutes on two cores
# Sizes whose large values are a valid request for a huge model or corpus, not a bad input: their range mutation is skipped.
SIZE_FIELDS = ("d_model", "n_layers", "n_heads", "mlp_ratio", "max_docs", "max_steps", "batch_size", "seq_len", "vocab_size",
               "max_val_rows", "max_train_rows", "k", "depth", "num_workers", "num_proc")


def typed_fields(cfg: DictConfig) -> list[tuple[str, object]]:
    """(dotted key, default value) of every plain leaf (not an interpolation, dict or list) of the groups."""
    out = []
    for group in GROUPS:
        node = OmegaConf.select(cfg, group)
        if not isinstance(node, DictConfig):
            continue
        for key in node.keys():
            if OmegaConf.is_interpolation(node, key) or OmegaConf.is_missing(node, key):
                continue
            value = node[key]
            if not isinstance(value, (DictConfig, ListConfig)) and not str(key).startswith("_"):
                out.append((f"{group}.{key}", value))
    return out


def mutations(key: str, value) -> list[str]:
    """Wrong type, wrong sign, out of range: as command-line values."""
    leaf = key.rsplit(".", 1)[-1]
    if isinstance(value, bool):
        return ["maybe", "2"]
    if isinstance(value, int):
        return ["abc", "2.5", str(-abs(value) or -1), "0"] + ([] if leaf in SIZE_FIELDS else ["1000000000"])
    if isinstance(value, float):
        return ["abc", str(-abs(value) or -1.0), "0.0", "nan", "1e30"]
    if isinstance(value, str):
        return ["7", "no_such_option"]
    return ["abc", "-1"]  # null by default: any type may be allowed


def all_mutations() -> list[str]:
    base = compose(Path(CONF_DIR), list(TINY))
    return [f"{key}={value}" for key, default in typed_fields(base) for value in mutations(key, default)]


def outcome(mutation: str, run_dir: Path, cache_dir: Path) -> str:
    """'refused <field>' or 'trained'; anything else raises (the test fails naming the mutation)."""
    from tests.fit_helpers import make_trainer
    from lab.train import build

    # paths.output_dir: what Hydra's runtime would give (the Trainer's root); nothing is written there before fit
    argv = [*TINY, mutation, f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache_dir}", f"paths.output_dir={run_dir}"]
    try:
        cfg = preflight(argv, Path(CONF_DIR))
        datamodule, module = build(cfg)
        hydra.utils.instantiate(cfg.trainer, logger=False, callbacks=[])  # the Trainer's own constructor checks, as lab-train builds it
    except ConfigError as error:
        assert "\n" not in str(error) and error.field, (mutation, str(error))
        return f"refused {error.field}"
    trainer = make_trainer(run_dir.parent / "fit", max_steps=1, precision=cfg.trainer.precision)
    try:
        trainer.fit(module, datamodule=datamodule)
    except FloatingPointError:  # the harness's non-finite-loss stop: a one-line `failed` record in the CLI
        return "diverged"
    return "trained"


@pytest.mark.slow  # a few minutes: SAMPLE compositions, builds and one-step fits
def test_every_mutation_of_a_typed_field_trains_or_is_refused_in_one_line_without_a_folder(tmp_path, cache_dir):
    seed = int(os.environ.get("MTP_LAB_MUTATION_SEED", random.SystemRandom().randrange(1 << 16)))
    every = all_mutations()
    chosen = every if os.environ.get("MTP_LAB_MUTATIONS") == "all" else random.Random(seed).sample(every, min(SAMPLE, len(every)))
    print(f"mutation seed {seed} (replay: MTP_LAB_MUTATION_SEED={seed}); {len(chosen)} of {len(every)} mutations")
    tracebacks, results = [], {}
    for mutation in chosen:
        run_dir = tmp_path / "runs" / "never"
        try:
            results[mutation] = outcome(mutation, run_dir, tmp_path / "cache")
        except Exception as error:  # what the CLI would end in a traceback for
            tracebacks.append(f"{mutation}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        assert not run_dir.exists(), f"{mutation}: the run folder was made before the config was accepted"
    print("\n".join(f"{m}: {r}" for m, r in results.items()))
    assert not tracebacks, f"seed {seed}:\n" + "\n".join(tracebacks)
    assert any(r.startswith("refused") for r in results.values()), "no mutation was refused: the generator mutates nothing"

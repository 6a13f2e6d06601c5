"""Shared fixtures: one dataset cache per session, one intra-op thread for tiny-tensor tests, the real config scaled down."""

import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One dataset/tokenizer cache for the whole session (the cached `map` is reused)."""
    return tmp_path_factory.mktemp("mtp-lab-cache")


@pytest.fixture(scope="module")
def single_thread():
    """Tiny tensors: intra-op threads only add overhead (20x on a loaded machine). Restored afterwards.

    Model-side test files opt in with `pytestmark = pytest.mark.usefixtures("single_thread")`.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tiny_cfg(cache_dir):
    """`tiny_cfg(*overrides)`: conf/train.yaml composed by Hydra, scaled down by `tests.cli.TINY`."""
    from tests.fit_helpers import compose_cfg

    return lambda *overrides: compose_cfg(*overrides, cache_dir=cache_dir)

import os

import pytest

os.environ.setdefault("WANDB_MODE", "offline")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One dataset/tokenizer cache for the whole session (the cached `map` is reused)."""
    return tmp_path_factory.mktemp("mtp-lab-cache")

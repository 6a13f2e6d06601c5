"""Logical live-logit bytes per backward schedule (the oracle of docs/api.md)."""

import pytest
import torch

from lab.errors import ConfigError
from lab.objective.logit_bytes import LIVE_ROWS, logit_bytes

COUNTS = (9, 6, 3)
V = 128


def test_registry_names():
    assert set(LIVE_ROWS) == {"joint", "sequential", "chunked"}


def test_joint_keeps_every_horizon_alive():
    # 4 · 128 · (9 + 6 + 3) = 9216
    assert logit_bytes(COUNTS, V, schedule="joint") == 9216


def test_sequential_keeps_the_largest_horizon_alive():
    # 4 · 128 · 9 = 4608
    assert logit_bytes(COUNTS, V, schedule="sequential") == 4608


def test_chunked_keeps_one_chunk_alive():
    # 4 · 128 · min(4, 9) = 2048
    assert logit_bytes(COUNTS, V, schedule="chunked", chunk_rows=4) == 2048


def test_chunked_with_chunk_larger_than_any_horizon_equals_sequential():
    assert logit_bytes(COUNTS, V, schedule="chunked", chunk_rows=100) == 4608


def test_tensor_counts_and_other_element_sizes():
    counts = torch.tensor(COUNTS)
    assert logit_bytes(counts, V, schedule="joint", bytes_per_element=2) == 4608
    assert isinstance(logit_bytes(counts, V, schedule="joint"), int)


@pytest.mark.parametrize("schedule", ["joint", "sequential"])
def test_empty_counts_are_zero_bytes(schedule):
    assert logit_bytes((0, 0, 0), V, schedule=schedule) == 0
    assert logit_bytes((), V, schedule=schedule) == 0


def test_unknown_schedule_names_the_field_and_choices():
    with pytest.raises(ConfigError, match=r"^schedule\.name: unknown 'eager'; allowed: joint, sequential, chunked") as error:
        logit_bytes(COUNTS, V, schedule="eager")
    assert error.value.field == "schedule.name"


@pytest.mark.parametrize("chunk_rows", [None, 0, -4])
def test_chunked_needs_chunk_rows_of_at_least_one(chunk_rows):
    with pytest.raises(ConfigError, match=r"^schedule\.chunk_rows: must be an integer ≥ 1"):
        logit_bytes(COUNTS, V, schedule="chunked", chunk_rows=chunk_rows)


def test_chunk_rows_is_ignored_by_unchunked_schedules():
    assert logit_bytes(COUNTS, V, schedule="sequential", chunk_rows=0) == 4608

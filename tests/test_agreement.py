"""Draft-agreement metrics (lab/callbacks/agreement.py) on hand-built argmaxes."""

from __future__ import annotations

import pytest
import torch

from lab.callbacks.agreement import agreement_counts, agreement_metrics


def grid(*rows):
    return torch.tensor([list(rows)])  # [1, S-k]


def test_hand_built_argmaxes_give_the_expected_fractions():
    # S = 5. Horizon 1 row t predicts t+1: [5, 6, 7, 8].
    # Horizon 2 row t predicts t+2, compared with horizon 1 at t+1 = [6, 7, 8]: agrees at t = 0, 2.
    # Horizon 3 row t predicts t+3, compared with horizon 1 at t+2 = [7, 8]: agrees at t = 0, 1.
    metrics = agreement_metrics(agreement_counts([grid(5, 6, 7, 8), grid(6, 0, 8), grid(7, 8)]))
    assert metrics["val/agree/h2"].item() == pytest.approx(2 / 3)
    assert metrics["val/agree/h3"].item() == pytest.approx(1.0)
    assert metrics["val/agree_chain/h2"].item() == pytest.approx(2 / 3)
    # Chain at horizon 3: rows 0..1 where horizon 2 agreed → t = 0 only; it agrees there.
    assert metrics["val/agree_chain/h3"].item() == pytest.approx(1.0)
    assert metrics["val/est_tokens_per_forward"].item() == pytest.approx(1 + 2 / 3 + 2 / 3 * 1.0)


def test_unsupervised_rows_are_left_out_and_the_chain_conditions():
    # S = 6; horizon 1 is unsupervised at row 3 (-1), so nothing is compared against it there.
    h1 = grid(1, 2, 3, -1, 5)
    h2 = grid(2, 9, 4, 5)  # references h1[1..4] = [2, 3, -1, 5]: rows 0, 1, 3 compared; rows 0, 3 agree
    h3 = grid(3, 4, 0)  # references h1[2..4] = [3, -1, 5]: rows 0, 2 compared; row 0 agrees
    counts = agreement_counts([h1, h2, h3])
    assert counts["compared"].tolist() == [4, 3, 2] and counts["agreed"].tolist() == [4, 2, 1]
    # Chain at horizon 2: rows where horizons 1 and 2 are both comparable (t = 0, 1); agrees at t = 0.
    # Chain at horizon 3: rows comparable at 1, 2, 3 → t = 0 only; horizon 2 agreed there, horizon 3 too.
    assert counts["chain_rows"].tolist()[1:] == [2, 1] and counts["chain_agreed"].tolist()[1:] == [1, 1]
    metrics = agreement_metrics(counts)
    assert metrics["val/agree/h2"].item() == pytest.approx(2 / 3) and metrics["val/agree/h3"].item() == pytest.approx(0.5)
    assert metrics["val/est_tokens_per_forward"].item() == pytest.approx(1 + 0.5 + 0.5 * 1.0)


def test_k1_has_no_agreement_metrics():
    assert agreement_metrics(agreement_counts([grid(1, 2, 3)])) == {}

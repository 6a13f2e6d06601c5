"""The teacherless objective (lab/data/synthetic/teacherless.py): answers predicted from the prompt alone.

Hand masks on a packed induction row, a perturbation test per head (the answer rows no longer
depend on earlier answer tokens), and the CLI switch with its refusal on text data.
"""

from __future__ import annotations

import pytest
import torch

from lab.data import SymbolTokenizer, build_datamodule
from lab.labels import horizon_mask
from lab.model.mtp import build_model
from tests.cli import lab_train, read_run

pytestmark = pytest.mark.usefixtures("single_thread")

# Induction, 4 symbols, span 2, distance 3: an example is `a b c = a b EOS` minus the filler: `s0 s1 = s0 s1 EOS`
# (6 tokens); two examples fill 12 of 13 positions, the answers at 3, 4 and 9, 10, padding at 12.
OPTIONS = {"source": "induction", "num_symbols": 4, "span_len": 2, "distance": 3, "train_examples": 2, "val_examples": 2,
           "seq_len": 13, "batch_size": 1, "shuffle": False}
ANSWER_AT = [3, 4, 9, 10]


def rows(teacherless: bool) -> tuple[dict, SymbolTokenizer]:
    module = build_datamodule({**OPTIONS, "teacherless": teacherless})
    module.setup()
    return module.train_rows.as_dict(), module.tokenizer


def test_answer_inputs_are_the_dummy_and_the_targets_are_the_answer():
    plain, tokenizer = rows(False)
    columns, _ = rows(True)
    assert "input_tokens" not in plain
    pad = tokenizer.pad_id
    tokens, inputs = columns["tokens"][0], columns["input_tokens"][0]  # [13] each
    assert torch.equal(tokens, plain["tokens"][0])  # the labels are the data, unchanged
    expected = tokens.clone()
    expected[ANSWER_AT] = pad  # the four answer positions, by hand
    assert torch.equal(inputs, expected)
    assert tokens[ANSWER_AT].ne(pad).all() and inputs[[2, 5, 8, 11]].tolist() == [tokenizer.encode("=")[0], tokenizer.eos_id] * 2
    for name in ("active", "segment_ids", "position_ids", "target_mask"):
        assert torch.equal(columns[name], plain[name]), name
    active, segments, target = columns["active"], columns["segment_ids"], columns["target_mask"]
    assert target[0].nonzero().flatten().tolist() == ANSWER_AT
    # Horizon 1's supervised rows predict the answers: rows 2, 3, 8, 9 (inputs `=`, dummy, `=`, dummy).
    assert horizon_mask(active, segments, 1, target)[0].nonzero().flatten().tolist() == [2, 3, 8, 9]
    assert inputs[[2, 3, 8, 9]].tolist() == [tokenizer.encode("=")[0], pad] * 2


@pytest.mark.parametrize("head", [{"name": "ntp", "k": 1}, {"name": "parallel", "k": 2}, {"name": "deepseek", "k": 2},
                                  {"name": "identity", "k": 2}, {"name": "linear", "k": 2}])
def test_answer_rows_do_not_depend_on_earlier_answer_tokens(head):
    columns, _ = rows(True)
    torch.manual_seed(0)
    model = build_model({"vocab_size": 8, "d_model": 16, "n_heads": 2, "n_layers": 4}, head)
    changed = {**columns, "tokens": columns["tokens"].clone()}
    changed["tokens"][0, 3] = (changed["tokens"][0, 3] + 1) % 4  # the first example's first answer token
    for name, batch in (("teacherless", changed), ("teacher-forced", {k: v for k, v in changed.items() if k != "input_tokens"})):
        reference = columns if name == "teacherless" else {k: v for k, v in columns.items() if k != "input_tokens"}
        for before, after in zip(model(reference), model(batch)):
            same = torch.allclose(before.hidden[0, 3], after.hidden[0, 3])  # row 3 predicts answer token 4 (at k=1)
            if name == "teacherless":
                assert same, (head, before.k)
                assert torch.equal(after.labels[0], changed["tokens"][0, before.offset or before.k:])  # labels: the data
            elif before.k == 1:
                assert not same, head  # teacher forcing reads the answer token: the check above can fail


CLI_SMALL = [
    "model.d_model=32", "model.n_layers=4", "model.n_heads=2", "data.train_examples=400", "data.val_examples=32",
    "data.answer_examples=8", "trainer.max_steps=10", "trainer.val_check_interval=10", "trainer.log_every_n_steps=5",
    "optim.warmup_steps=2", "trainer.enable_progress_bar=false", "callbacks.decoding.prompts=1", "callbacks.decoding.new_tokens=8",
]


@pytest.mark.slow
def test_teacherless_through_the_cli_and_refused_on_text(tmp_path, cache_dir):
    run = tmp_path / "run"
    result = lab_train("data=star_graph", "head=deepseek", "head.k=2", "objective.teacherless=true", *CLI_SMALL,
                       f"hydra.run.dir={run}", cache_dir=cache_dir, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    record = read_run(run)
    assert record["config"]["objective"]["teacherless"] is True and record["config"]["data"]["teacherless"] is True
    final = record["final_metrics"]
    assert final["val/answer_token_acc"] == final["val/answer_tf_acc"]  # decoded teacherless: one forward, no teacher
    refused = lab_train("objective.teacherless=true", cache_dir=cache_dir, cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("error: objective.teacherless: needs a synthetic task")

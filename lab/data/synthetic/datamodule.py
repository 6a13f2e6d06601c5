"""The DataModule of a synthetic task: a fixed set of generated examples, packed whole into rows.

- Examples are a pure function of the task fields and `data.seed`: the validation set is
  drawn first from its own stream, then the training set from another, skipping any problem
  (`Example.key`) the validation set holds, so train and val are disjoint and changing
  `train_examples` never changes the validation set. Training runs many epochs over the
  fixed training set (as in Bachmann & Nagarajan 2024).
- A document is `prompt answer EOS` in the task's own `SymbolTokenizer`. Rows follow the
  packing rules of lab/data/packing.py (segment ids, position restart, document-causal
  attention) except that an example is never cut across rows: each row holds as many whole
  examples as fit and is padded after them, so every answer has its prompt in view.
- `data.loss_on` chooses the tokens that may be a label through the batch key `target_mask`
  (lab/labels.py): `answer` — only the answer tokens (the prompt stays active: attention
  context and DeepSeek chain input, never a target); `all` — every token, EOS included.
- `teacherless` (set from `objective.teacherless` by the data configs) adds the column
  `input_tokens`, the answers replaced by a dummy (lab/data/synthetic/teacherless.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

import numpy as np
import torch

from lab.data.loaders import RowsDataModule
from lab.data.packing import COLUMNS, pack_row
from lab.data.synthetic.config import LOSS_ON, validate_synthetic_config
from lab.data.synthetic.example import Example
from lab.data.synthetic.teacherless import teacherless_ids
from lab.data.tokenizers import SymbolTokenizer
from lab.errors import require

ROW_COLUMNS = (*COLUMNS, "target_mask")
_GENERATOR_VERSION = 1  # bump when a task's examples change, so fingerprints (and resumes) notice
_MAX_DRAWS_PER_EXAMPLE = 20


# ---------------------------------------------------------------------------- examples


def generate_examples(task, n_train: int, n_val: int, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, val): val distinct problems first, then train problems none of which is in val."""
    val_rng, train_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    val = _draw(task, n_val, val_rng, taken=set(), distinct=True, field="data.val_examples")
    train = _draw(task, n_train, train_rng, taken={e.key for e in val}, distinct=False, field="data.train_examples")
    return train, val


def _draw(task, n: int, rng: np.random.Generator, *, taken: set, distinct: bool, field: str) -> list[Example]:
    out = []
    for _ in range(n * _MAX_DRAWS_PER_EXAMPLE):
        if len(out) == n:
            break
        example = task.sample(rng)
        if example.key in taken:
            continue
        if distinct:
            taken.add(example.key)
        out.append(example)
    require(len(out) == n, field, f"only {len(out)} of {n} examples are new problems after {n * _MAX_DRAWS_PER_EXAMPLE} draws; "
            "lower it or enlarge the task (num_nodes, num_symbols, …)")
    return out


def encode_example(example: Example, tokenizer: SymbolTokenizer, loss_on: str) -> tuple[list[int], list[bool]]:
    """(ids ending with EOS, may-be-a-label flag per id)."""
    ids = tokenizer.encode_symbols(example.prompt) + tokenizer.encode_symbols(example.answer) + [tokenizer.eos_id]
    return ids, LOSS_ON[loss_on](len(example.prompt), len(example.answer))


def pack_examples(documents: list[tuple[list[int], list[bool]]], seq_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Whole documents per row (greedy, in order), each row padded after its last document: five [N, S] columns."""
    rows, window, flags, starts = [], [], [], []

    def flush():
        row = pack_row(np.asarray(window, dtype=np.int64), np.asarray(starts[1:], dtype=np.int64), seq_len, pad_id)  # each [S]
        target = torch.zeros(seq_len, dtype=torch.bool)
        target[: len(flags)] = torch.tensor(flags, dtype=torch.bool)  # [S]; padding is never a target
        rows.append({**row, "target_mask": target})

    for ids, may_be_label in documents:
        assert len(ids) <= seq_len, (len(ids), seq_len)
        if len(window) + len(ids) > seq_len:
            flush()
            window, flags, starts = [], [], []
        starts.append(len(window))
        window += ids
        flags += may_be_label
    if window:
        flush()
    return {name: torch.stack([row[name] for row in rows]) for name in ROW_COLUMNS}  # each [N, S]


class ExampleRows(torch.utils.data.Dataset):
    """Packed rows held in memory; an item is a dict of the five [S] columns."""

    def __init__(self, columns: dict[str, torch.Tensor]):
        self.columns = columns  # each [N, S]

    def __len__(self) -> int:
        return self.columns["tokens"].shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: column[index] for name, column in self.columns.items()}  # each [S]

    def head(self, n_rows: int | None) -> ExampleRows:
        return self if n_rows is None else ExampleRows({name: column[:n_rows] for name, column in self.columns.items()})

    def as_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.columns)


@dataclass(frozen=True)
class _Prepared:
    train_rows: ExampleRows
    val_rows: ExampleRows
    val_examples: list[Example]
    corpus_stats: dict


class SyntheticDataModule(RowsDataModule):
    """Batches of a synthetic task (the batch keys of docs/tensor-conventions.md plus `target_mask`, and `input_tokens` when teacherless; each [B, S])."""

    def __init__(self, **options):
        super().__init__()
        self.config = validate_synthetic_config(**options)
        self.save_hyperparameters(self.config.as_dict())
        self.tokenizer = SymbolTokenizer(self.config.task.symbols())

    def prepare(self) -> None:
        if self._prepared is not None:
            return
        config = self.config
        train, val = generate_examples(config.task, config.train_examples, config.val_examples, config.seed)
        pack = lambda examples: ExampleRows(self._pack(examples))  # noqa: E731
        train_rows, val_rows = pack(train), pack(val).head(config.max_val_rows)
        require(
            len(train_rows) >= config.batch_size,
            "data.batch_size",
            f"{config.train_examples} training examples pack into {len(train_rows)} rows of seq_len {config.seq_len}, "
            f"fewer than batch_size {config.batch_size}; lower batch_size or add train_examples",
        )
        stats = {
            "n_examples_train": len(train),
            "n_examples_val": len(val),
            "example_tokens": len(train[0]) + 1,
            "answer_tokens": len(train[0].answer),
            "examples_per_row": config.seq_len // (len(train[0]) + 1),
            "n_rows_train": len(train_rows),
            "n_rows_val": len(val_rows),
            "n_tokens_train": int(train_rows.columns["active"].sum()),
            "n_targets_train": int(train_rows.columns["target_mask"].sum()),
        }
        self._prepared = _Prepared(train_rows, val_rows, val, stats)

    def _pack(self, examples: list[Example]) -> dict[str, torch.Tensor]:
        """The row columns of `examples` (each [N, S]), plus `input_tokens` when teacherless."""
        config, tokenizer = self.config, self.tokenizer
        documents = [encode_example(e, tokenizer, config.loss_on) for e in examples]
        columns = pack_examples(documents, config.seq_len, tokenizer.pad_id)
        if config.teacherless:  # same lengths, so the same rows: only the answer ids differ
            inputs = [(teacherless_ids(tokenizer.encode_symbols(e.prompt), len(e.answer), tokenizer.eos_id, self.teacherless_dummy_id), flags)
                      for e, (_, flags) in zip(examples, documents)]
            columns["input_tokens"] = pack_examples(inputs, config.seq_len, tokenizer.pad_id)["tokens"]  # [N, S]
        return columns

    # ---------------------------------------------------- what the run reads

    @property
    def teacherless_dummy_id(self) -> int | None:
        """The id that stands for every answer token in a teacherless run's inputs; None when not teacherless."""
        return self.tokenizer.pad_id if self.config.teacherless else None

    @property
    def decision_index(self) -> int:
        return self.config.task.decision_index

    @property
    def decision_chance(self) -> float:
        return self.config.task.decision_chance

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def tokenizer_identity(self) -> dict:
        return self.tokenizer.identity

    @property
    def corpus_fingerprint(self) -> str:
        """The data set's identity: the generator, the task and how many examples of which seed."""
        config = self.config
        named = {"version": _GENERATOR_VERSION, "source": config.source, **dataclasses.asdict(config.task),
                 "train_examples": config.train_examples, "val_examples": config.val_examples, "seed": config.seed,
                 "loss_on": config.loss_on}
        return hashlib.sha256(json.dumps(named, sort_keys=True).encode("utf-8")).hexdigest()

    @property
    def target_byte_lengths(self) -> None:
        return None  # symbols are not text: val/bits_per_token only, no val/bpb

    def answer_examples(self) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, answer ids) of the first `data.answer_examples` validation examples."""
        examples = self._require_prepared().val_examples[: self.config.answer_examples]
        return [(self.tokenizer.encode_symbols(e.prompt), self.tokenizer.encode_symbols(e.answer)) for e in examples]

"""Answer metrics of a synthetic-task run on its training examples next to its validation examples.

    python -m analysis.answer_split RUN_DIR [--examples 256]

Loads RUN_DIR/checkpoints/last.ckpt, rebuilds the run's data set from RUN_DIR/run.json's `data`
config (generation is a pure function of it), and scores the first N training and validation
answers with lab.decode.answers (teacherless runs the teacherless way). Training exact far above
validation exact means the model memorised its training graphs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lab.data import build_datamodule
from lab.data.synthetic import generate_examples
from lab.decode.answers import answer_accuracy
from lab.decode.loading import load_for_generation

SHOWN = ("answer_exact", "answer_exact_se", "answer_first_acc", "answer_exact_given_first", "answer_tf_acc")


def split_scores(run_dir: Path, n: int) -> dict[str, dict[str, float]]:
    config = json.loads((run_dir / "run.json").read_text())["config"]["data"]
    module = build_datamodule(config)
    model = load_for_generation(run_dir).model
    encode = module.tokenizer.encode_symbols
    train_examples, val_examples = generate_examples(module.config.task, module.config.train_examples, module.config.val_examples,
                                                     module.config.seed)
    pairs = lambda examples: [(encode(e.prompt), encode(e.answer)) for e in examples[:n]]  # noqa: E731
    score = lambda examples: answer_accuracy(model, pairs(examples), module.decision_index, module.teacherless_dummy_id)  # noqa: E731
    return {"train": score(train_examples), "val": score(val_examples)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--examples", type=int, default=256)
    args = parser.parse_args(argv)
    for split, scores in split_scores(args.run_dir, args.examples).items():
        print(split, " ".join(f"{name}={scores[name]:.3f}" for name in SHOWN))


if __name__ == "__main__":
    main()

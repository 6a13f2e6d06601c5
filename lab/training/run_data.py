"""The data module of a run from its `data` and `model` config mappings (training builds it; lab-generate
rebuilds it from a run's record to count the training tokens)."""

from __future__ import annotations


def run_datamodule(data: dict, model: dict):
    """A `model=hf` run reads any text source with the model's own tokenizer; synthetic tasks keep their symbols."""
    from lab.data import TASKS, build_datamodule
    from lab.model.trunks import trunk_spec

    data_options = dict(data)
    if data_options.get("source") not in TASKS:
        data_options.update(trunk_spec(model).tokenizer_options(model))
    return build_datamodule(data_options)

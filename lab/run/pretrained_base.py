"""A bare pretrained base as `lab-eval --model NAME` evaluates it: an entry of the `model` config group that
loads pretrained weights (e.g. `smollm2`), next-token head only, with the model's own tokenizer."""

from __future__ import annotations

from pathlib import Path

from lab.errors import ConfigError


def model_entry(conf_dir: Path, name: str) -> dict:
    """The model group's entry `name`, composed as `lab-train model=NAME` composes it."""
    from omegaconf import OmegaConf

    from lab.config.preflight import compose
    from lab.model.compile import split_compile_option

    entry = OmegaConf.to_container(compose(conf_dir, [f"model={name}"]).model, resolve=True)
    return split_compile_option(entry)[0]  # how to run the network, not what it is


def loads_pretrained(entry: dict) -> bool:
    """A GGUF that an installed package ships, or a local folder or file of weights."""
    from lab.model.trunks import trunk_spec

    return trunk_spec(entry).trained_weights(entry) is not None


def pretrained_entries(conf_dir: Path) -> list[str]:
    """The model group's entries that load pretrained weights."""
    return [path.stem for path in sorted((conf_dir / "model").glob("*.yaml")) if loads_pretrained(model_entry(conf_dir, path.stem))]


def load_base(name: str):
    """(model in eval mode, tokenizer) of the model group's entry `name`, as `lab-train model=NAME head=ntp` builds it."""
    from lab.data.hf_tokenizer import HFTokenizer
    from lab.model.trunks import trunk_spec
    from lab.model.mtp import build_model
    from lab.config.paths import CONF_DIR

    conf_dir = CONF_DIR
    known = (conf_dir / "model" / f"{name}.yaml").is_file()
    model_cfg = model_entry(conf_dir, name) if known else {}
    if not loads_pretrained(model_cfg):
        raise ConfigError("--model", f"{name!r} is not a pretrained base; allowed: {', '.join(pretrained_entries(conf_dir))} "
                                     "(or give a run directory, checkpoint or release folder)")
    folder = trunk_spec(model_cfg).tokenizer_options(model_cfg).get("tokenizer_path")  # the GGUF's own tokenizer, dequantised beside its weights
    tokenizer = HFTokenizer(folder, "--model")
    model = build_model(model_cfg, {"name": "ntp", "compute_match": "none"}).eval()
    return model, tokenizer

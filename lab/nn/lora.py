"""`head.trunk_grad=lora`: peft LoRA adapters on a pretrained trunk (model=hf); heads train fully.

peft injects the adapter layers into the transformers model in place and freezes every base
weight (embedding, final norm and lm_head included), so `HFTrunk.hf` stays the model the
rest of the harness knows; the PeftModel wrapper is kept beside it (not as a submodule, so no
Parameter gets a second state key) for `merge_and_unload` and adapter saving.
"""

from __future__ import annotations

import warnings

from lab.errors import ConfigError, require
from lab.schema import check_known

LORA_DEFAULTS = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": None}


def lora_settings(values: dict | None) -> dict:
    """`head.lora` with its defaults filled in, checked (target_modules null: peft's default for the family)."""
    values = dict(values or {})
    check_known("head.lora", values, list(LORA_DEFAULTS), owner="head.lora")
    settings = {**LORA_DEFAULTS, **{k: v for k, v in values.items() if v is not None}}
    require(isinstance(settings["r"], int) and settings["r"] >= 1, "head.lora.r", f"must be an integer ≥ 1, got {settings['r']!r}")
    require(isinstance(settings["alpha"], (int, float)) and settings["alpha"] > 0, "head.lora.alpha", f"must be a number > 0, got {settings['alpha']!r}")
    require(isinstance(settings["dropout"], (int, float)) and 0 <= settings["dropout"] < 1, "head.lora.dropout",
            f"must be a number in [0, 1), got {settings['dropout']!r}")
    modules = settings["target_modules"]
    require(modules is None or (isinstance(modules, (list, tuple)) and modules and all(isinstance(m, str) for m in modules)),
            "head.lora.target_modules", f"must be a list of module names (e.g. [q_proj, v_proj]) or null, got {modules!r}")
    return settings


def add_lora_adapters(trunk, values: dict | None) -> None:
    """Wrap `trunk.hf` with LoRA adapters; refuses target modules the model does not have in one line."""
    from peft import LoraConfig, get_peft_model

    settings = lora_settings(values)
    config = LoraConfig(r=settings["r"], lora_alpha=settings["alpha"], lora_dropout=settings["dropout"],
                        target_modules=None if settings["target_modules"] is None else list(settings["target_modules"]))
    try:
        with warnings.catch_warnings():  # peft calls a transformers method that 5.x marks deprecated
            warnings.simplefilter("ignore", FutureWarning)
            peft_model = get_peft_model(trunk.hf, config)
    except ValueError as error:
        names = sorted({name.rsplit(".", 1)[-1] for name, module in trunk.hf.named_modules() if type(module).__name__ in ("Linear", "Conv1D")})
        raise ConfigError("head.lora.target_modules", f"{str(error).splitlines()[0]}; this model's linear modules: {', '.join(names)}") from None
    trunk.__dict__["peft_model"] = peft_model  # beside the trunk, not a submodule: no second state key per Parameter


def merged_copy(trunk):
    """The transformers model with the adapters folded into the base weights (a copy; the trunk keeps its adapters)."""
    import copy

    return copy.deepcopy(trunk.__dict__["peft_model"]).merge_and_unload()

"""The network: trunk (trunk.py), heads (heads/), trunk + head (mtp.py), cost and FLOP counts.

Public API (docs/api.md): `build_model(model, head) -> MTPModel` from the same mappings as
the `model` and `head` config groups.
"""

from lab.model.mtp import MTPModel, build_model

__all__ = ["MTPModel", "build_model"]

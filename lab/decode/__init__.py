"""Decoding, the inference half (docs/api.md, docs/decoding.md).

Public API: `generate` (plain and speculative, with KV caches), `Generation`,
`select_mtp_one` (the one-proposal exact selector).
"""

from lab.decode.generate import Generation, generate
from lab.inference.acceptance import select_mtp_one

__all__ = ["Generation", "generate", "select_mtp_one"]

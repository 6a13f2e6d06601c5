"""Decoding (the inference half), DESIGN.md §10.

Public API: `generate` (plain and speculative, with KV caches), `Generation`,
`select_mtp_one` (the one-proposal exact selector of M7.6 §0x09).
"""

from lab.decode.acceptance import select_mtp_one
from lab.decode.generate import Generation, generate

__all__ = ["Generation", "generate", "select_mtp_one"]

"""The decoding application: generation, batching, loading, the CLI, evaluation (docs/api.md, docs/decoding.md);
the core it drives is lab.decode_core.

Public API: `generate` (plain and speculative, with KV caches), `Generation`,
`select_mtp_one` (the one-proposal exact selector).
"""

from lab.decode.generate import Generation, generate
from lab.decode_core.acceptance import select_mtp_one

__all__ = ["Generation", "generate", "select_mtp_one"]

"""The decoding core (docs/architecture.md): what one decoding step is made of, below the heads.

KV caches (`cache`, `hf_cache`), draft trees and proposal buffers (`tree`), token choice
(`sampling`), the target pass over cached state (`target`), acceptance (`acceptance`), the
ledgers (`ledger`, `moe_ledger`) and the proposer protocol (`proposer`). A head's drafter
(lab/model/heads/*_drafter.py) is written against these; the decoding application that
drives them (`generate`, batching, the CLI, loading, evaluation) is lab/decode.

This package imports nothing from its own modules here: a head importing `lab.inference.tree`
must not pull in the modules that import lab.model (cache, target, moe_ledger).
"""

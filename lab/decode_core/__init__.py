"""The decoding core (docs/architecture.md): what one decoding step is made of, below the heads.

KV caches (`cache`, `hf_cache`), draft trees and proposal buffers (`tree`), token choice
(`sampling`), the target pass over cached state (`target`), acceptance (`acceptance`), the
ledgers (`ledger`, `moe_ledger`) and the proposer protocol (`proposer`). A head's drafter
(lab/model/heads/*_drafter.py) is written against these; the decoding application that
drives them (`generate`, batching, the CLI, loading, evaluation) is lab/decode.

It imports no model (a trunk answers its cache protocol), and this `__init__` imports none of its
modules, so a head importing `lab.decode_core.tree` loads that module alone.
"""

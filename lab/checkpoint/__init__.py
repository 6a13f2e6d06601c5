"""Checkpoint semantics: the manifest (`manifest`), safe loading and validation (`loading`), RNG state (`rng`).

Writing is `lab.checkpoint.io.SafeCheckpointIO` (a Lightning plugin, kept apart because
importing Lightning is slow and the export tool does not need it).
"""

from lab.checkpoint.loading import (
    check_state_aliases,
    check_state_keys,
    content_digest,
    load_checkpoint,
    validate_checkpoint,
    verify_restored,
)
from lab.checkpoint.manifest import (
    CHECKED_FIELDS,
    MANIFEST_FORMAT,
    PACKING,
    alias_key_groups,
    build_manifest,
    compare_manifests,
    first_difference,
    horizon_map,
    plain,
    tokenizer_payload,
)
from lab.checkpoint.rng import collect_rng_states, collect_rng_states_of_every_rank, restore_rng_states, rng_states_for_rank

__all__ = [
    "CHECKED_FIELDS", "MANIFEST_FORMAT", "PACKING", "alias_key_groups", "build_manifest", "check_state_aliases",
    "check_state_keys", "collect_rng_states", "collect_rng_states_of_every_rank", "compare_manifests", "content_digest", "first_difference", "horizon_map",
    "load_checkpoint", "plain", "restore_rng_states", "rng_states_for_rank", "tokenizer_payload", "validate_checkpoint", "verify_restored",
]

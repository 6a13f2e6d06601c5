"""The families the installed transformers gives MTP layers, and what the harness does with each.

One table: a family is either *round-trip* (a default test pins that transformers' `generate(use_mtp=True)`
on a folder the harness wrote drafts, accepts and emits what the harness's speculative decoder does, and
that the harness reads a folder transformers' layout holds) or refused in one line saying why. A family
transformers adds later is refused until someone puts it here with a test (tests/test_release_suite.py
lists the families from the installed transformers source and fails on one missing here).
"""

from __future__ import annotations

from dataclasses import dataclass

LAYERS_LAYOUT = "model.layers.{N+d-1}"  # MTP layer d keeps its keys after the N main layers


@dataclass(frozen=True)
class MTPFamily:
    round_trip: bool  # exported and imported by the harness, pinned by a round-trip test
    why: str  # what the family's MTP layers are; for a refused family, why the harness does not read or write them
    # model=hf with this family as the trunk (tests/test_family_paths.py runs each path that is not refused):
    native_block: str | None = None  # why head.block=native cannot run the family's decoder layer (None: it trains and decodes)
    decoding: str | None = None  # why the harness's cached decoding cannot run this trunk (None: plain == speculative greedy)


HYBRID_CACHE = ("its trunk keeps recurrent (convolution / linear-attention) state in transformers' own hybrid cache, which the "
                "harness's cached decoding does not hold: train with it, decode with transformers' generate")


UNVERIFIED = ("keeps its MTP layers as " + LAYERS_LAYOUT + " like deepseek_v3, but no round-trip test pins that the harness's depth "
              "module computes what transformers' MtpLayer computes for this family's decoder layer")

MTP_FAMILIES = {
    "deepseek_v3": MTPFamily(True, "MLA attention, MoE MTP layers (get_mtp_config sets first_k_dense_replace = 0), [embedding, hidden] fusion"),
    "glm4_moe": MTPFamily(True, "grouped-query attention with partial rotary, MoE MTP layers, [embedding, hidden] fusion"),
    "sarvam_moe": MTPFamily(False, UNVERIFIED),
    "sarvam_mla": MTPFamily(False, UNVERIFIED),
    "param2moe": MTPFamily(False, UNVERIFIED),
    "ernie4_5_moe": MTPFamily(False, "keeps its one MTP layer as mtp_block.{k} / mtp_emb_norm.{k} / mtp_linear_proj.{k}, not as "
                                     + LAYERS_LAYOUT + ", the only layout the harness reads and writes"),
    "deepseek_v4": MTPFamily(False, "keeps its MTP layers under mtp.*, not as " + LAYERS_LAYOUT + ", the only layout the harness reads and writes",
                             native_block="its decoder layer reads and writes hc_mult hyper-connection streams, not the one hidden "
                                          "state a head block passes on",
                             decoding="its attention stores compressed key/value state transformers' DynamicCache layer does not "
                                      "have (store_compression_weights): the harness's cached decoding cannot run it"),
    "inkling_text": MTPFamily(False, "its MTP layers have no rotary embedding (learned position biases), fuse [hidden, embedding] and pass "
                                     "the chain through one shared post-norm (chain_hidden_post_norm): the harness's depth module does neither",
                             decoding=HYBRID_CACHE),
    "bailing_hybrid": MTPFamily(False, "hybrid linear-attention layers with per-layer rotary (mtp_layer_types): the harness's native head "
                                       "block runs a layer without its layer type's masks",
                                native_block="its linear-attention layers take a 2-D padding mask, not the packed rows' 4-D "
                                             "document-causal mask a head block is given",
                                decoding=HYBRID_CACHE),
    "mellum": MTPFamily(False, "per-layer attention and MLP kinds for its MTP layers (mtp_layer_types, mtp_mlp_layer_types): no round-trip "
                               "test pins that the harness's depth module computes what transformers' MtpLayer computes for them"),
    "nemotron_h": MTPFamily(False, "hybrid Mamba / attention / MoE MTP blocks (mtp_layers_block_type): the harness's depth module holds "
                                   "one decoder layer",
                           decoding=HYBRID_CACHE),
}


def family_refusal(family: str) -> str | None:
    """Why the harness neither writes nor reads `family`'s MTP layers (None: a round-trip family)."""
    entry = MTP_FAMILIES.get(family)
    if entry is None:
        return (f"model_type '{family}' is not in the harness's table of MTP families (transformers gives MTP layers to "
                f"{', '.join(sorted(MTP_FAMILIES))}); round-trip families: {', '.join(round_trip_families())}")
    return None if entry.round_trip else f"model_type '{family}': {entry.why}"


def round_trip_families() -> list[str]:
    return [name for name, entry in MTP_FAMILIES.items() if entry.round_trip]


def family_path_refusal(hf_config, path: str) -> str | None:
    """Why `path` ('native_block' or 'decoding') cannot run on a model=hf trunk of this config's family, in one line (None: it runs)."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    family = getattr(text, "model_type", None)
    entry = MTP_FAMILIES.get(family)
    why = None if entry is None else getattr(entry, path)
    return None if why is None else f"model_type '{family}': {why}"

"""Small GGUF files written with the gguf package's own writer (GGUFWriter), as llama.cpp lays them out:
a tiny Llama with a byte-level BPE tokenizer (converts in seconds), and the broken variants the
bad-input tests need (an unmapped architecture, a quantisation nothing dequantises, a cut-off file)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from lab.data.tokenizers import BPETokenizer
from tests.hf_fixtures import TEXTS

D_MODEL, FFN, LAYERS, HEADS, KV_HEADS = 32, 64, 2, 4, 2


def tokenizer_parts(vocab_size: int = 300) -> tuple[list[str], list[str]]:
    """Tokens in id order (special tokens first) and merges of a byte-level BPE trained on the fixture texts.
    The padding token is renamed <|endoftext|>: transformers' GGUF tokenizer adds that token (as unk) when absent."""
    model = json.loads(BPETokenizer.train(TEXTS, vocab_size)._tokenizer.to_str())["model"]
    tokens = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model["merges"]]
    return [("<|endoftext|>" if token == "<|pad|>" else token) for token in tokens], merges


def write_llama_gguf(path: Path, *, architecture: str = "llama", qtype: str = "F32", seed: int = 0, edit=None) -> Path:
    """A 2-layer Llama GGUF with random weights; `qtype` names the storage type of the 2-D weights;
    `edit(name, values)` returns the float32 values to store for a tensor (a damage)."""
    import gguf

    tokens, merges = tokenizer_parts()
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny test llama")
    writer.add_context_length(128)
    writer.add_embedding_length(D_MODEL)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(D_MODEL // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    specials = [i for i, token in enumerate(tokens) if token.startswith("<|")]
    writer.add_token_types([gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL for i in range(len(tokens))])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|bos|>"))
    writer.add_eos_token_id(tokens.index("<|eos|>"))
    head_dim = D_MODEL // HEADS
    shapes = {"token_embd.weight": (len(tokens), D_MODEL), "output_norm.weight": (D_MODEL,), "output.weight": (len(tokens), D_MODEL)}
    for layer in range(LAYERS):
        shapes |= {f"blk.{layer}.attn_norm.weight": (D_MODEL,), f"blk.{layer}.ffn_norm.weight": (D_MODEL,),
                   f"blk.{layer}.attn_q.weight": (D_MODEL, D_MODEL), f"blk.{layer}.attn_k.weight": (KV_HEADS * head_dim, D_MODEL),
                   f"blk.{layer}.attn_v.weight": (KV_HEADS * head_dim, D_MODEL), f"blk.{layer}.attn_output.weight": (D_MODEL, D_MODEL),
                   f"blk.{layer}.ffn_gate.weight": (FFN, D_MODEL), f"blk.{layer}.ffn_up.weight": (FFN, D_MODEL),
                   f"blk.{layer}.ffn_down.weight": (D_MODEL, FFN)}
    for name, shape in shapes.items():
        values = (1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else 0.2 * rng.standard_normal(shape)).astype(np.float32)
        if edit is not None:
            values = edit(name, values)
        if len(shape) == 2 and qtype != "F32":
            kind = gguf.GGMLQuantizationType[qtype]
            block, size = gguf.GGML_QUANT_SIZES[kind]
            raw = np.zeros((shape[0], shape[1] // block * size), dtype=np.uint8)  # zeros: only the type matters to the refusal
            writer.add_tensor(name, raw, raw_dtype=kind)  # the byte shape: the writer derives the element shape
        else:
            writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def truncated_copy(source: Path, out: Path, keep: float = 0.5) -> Path:
    data = source.read_bytes()
    out.write_bytes(data[: int(len(data) * keep)])
    return out

"""A local Hugging Face model folder for tests: a tiny Llama (random weights) and a byte-level BPE
tokenizer trained on a few lines, written with save_pretrained — what `model.path` reads."""

from __future__ import annotations

from pathlib import Path

import torch

from lab.data.tokenizers import BPETokenizer

TEXTS = [f"def f{i}(x):\n    return x * {i} + {i % 3}\n" for i in range(40)]


def write_tokenizer(folder: Path, vocab_size: int = 300) -> int:
    """A transformers tokenizer folder; returns its vocabulary size."""
    from transformers import PreTrainedTokenizerFast

    bpe = BPETokenizer.train(TEXTS, vocab_size)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>")
    tokenizer.save_pretrained(folder)
    return len(tokenizer)


def write_llama(folder: Path, vocab_size: int = 300, seed: int = 0, tokenizer: bool = True) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model("llama", vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    if tokenizer:
        write_tokenizer(folder)
    return folder

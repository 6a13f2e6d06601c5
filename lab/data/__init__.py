"""Data pipeline: corpora, tokenizers, packing into DESIGN.md §2 rows, and the DataModule."""

from lab.data.datamodule import DataConfig, LMDataModule, validate_data_config
from lab.data.packing import (
    COLUMNS,
    PackedRows,
    pack_documents,
    pack_stream,
    pack_tokenized,
    token_stream,
    tokenize_documents,
    unigram_entropy_bits,
)
from lab.data.sources import SOURCES, Corpus, load_corpus, split_bucket, stdlib_files
from lab.data.tokenizers import TOKENIZER_KINDS, BPETokenizer, ByteTokenizer, Tokenizer, build_tokenizer

__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "COLUMNS",
    "Corpus",
    "DataConfig",
    "LMDataModule",
    "PackedRows",
    "SOURCES",
    "TOKENIZER_KINDS",
    "Tokenizer",
    "build_tokenizer",
    "load_corpus",
    "pack_documents",
    "pack_stream",
    "pack_tokenized",
    "split_bucket",
    "stdlib_files",
    "token_stream",
    "tokenize_documents",
    "unigram_entropy_bits",
    "validate_data_config",
]

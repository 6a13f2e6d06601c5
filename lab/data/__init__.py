"""Data pipeline: corpora, tokenizers, packing into DESIGN.md §2 rows, and the DataModule."""

from lab.data.datamodule import DataConfig, LMDataModule, validate_data_config
from lab.data.packing import (
    COLUMNS,
    PackedRows,
    pack_documents,
    pack_row,
    pack_stream,
    pack_tokenized,
    token_stream,
    tokenize_documents,
    unigram_entropy_bits,
)
from lab.data.sources import SOURCES, Corpus, HubDataset, load_corpus, resolve_local_files, split_bucket, stdlib_files
from lab.data.streaming import StreamingRows
from lab.data.token_store import MappedRows, TokenStream
from lab.data.tokenizers import TOKENIZER_KINDS, BPETokenizer, ByteTokenizer, Tokenizer, build_tokenizer

__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "COLUMNS",
    "Corpus",
    "DataConfig",
    "HubDataset",
    "LMDataModule",
    "MappedRows",
    "PackedRows",
    "SOURCES",
    "StreamingRows",
    "TOKENIZER_KINDS",
    "TokenStream",
    "Tokenizer",
    "build_tokenizer",
    "load_corpus",
    "resolve_local_files",
    "pack_documents",
    "pack_row",
    "pack_stream",
    "pack_tokenized",
    "split_bucket",
    "stdlib_files",
    "token_stream",
    "tokenize_documents",
    "unigram_entropy_bits",
    "validate_data_config",
]

"""Data pipeline: corpora, tokenizers, packing into the rows of docs/tensor-conventions.md, the DataModules, synthetic tasks."""

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
from lab.data.synthetic import TASKS, SyntheticDataModule, validate_synthetic_config
from lab.data.tokenizers import TOKENIZER_KINDS, BPETokenizer, ByteTokenizer, SymbolTokenizer, Tokenizer, build_tokenizer


def check_data_config(options: dict):
    """The typed `data` group: a synthetic task when `source` names one (conf/data/star_graph.yaml), else a text corpus."""
    return (validate_synthetic_config if options.get("source") in TASKS else validate_data_config)(**options)


def build_datamodule(options: dict) -> LMDataModule | SyntheticDataModule:
    return (SyntheticDataModule if options.get("source") in TASKS else LMDataModule)(**options)


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
    "SymbolTokenizer",
    "SyntheticDataModule",
    "TASKS",
    "TOKENIZER_KINDS",
    "TokenStream",
    "Tokenizer",
    "build_datamodule",
    "build_tokenizer",
    "check_data_config",
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

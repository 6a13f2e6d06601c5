"""Data pipeline: corpora, tokenizers, packing into the rows of docs/tensor-conventions.md, the DataModules, synthetic tasks."""

import importlib

from lab.data.config import DataConfig, validate_data_config
from lab.data.synthetic import TASKS, validate_synthetic_config

# Imported on first use (PEP 562): the config modules above are light, so the config schemas can read them
# without loading datasets, pyarrow or Lightning; these modules load those.
_LAZY = {
    "lab.data.datamodule": ("LMDataModule",),
    "lab.data.packing": ("COLUMNS", "PackedRows", "pack_documents", "pack_row", "pack_stream", "pack_tokenized", "token_stream",
                         "tokenize_documents", "unigram_entropy_bits"),
    "lab.data.sources": ("SOURCES", "load_corpus"),
    "lab.data.corpus_split": ("Corpus", "split_bucket"),
    "lab.data.hub_source": ("HubDataset",),
    "lab.data.local_files": ("resolve_local_files",),
    "lab.data.stdlib_source": ("stdlib_files",),
    "lab.data.streaming": ("StreamingRows",),
    "lab.data.token_store": ("MappedRows", "TokenStream"),
    "lab.data.synthetic": ("SyntheticDataModule",),
    "lab.data.tokenizers": ("TOKENIZER_KINDS", "BPETokenizer", "ByteTokenizer", "SymbolTokenizer", "Tokenizer", "build_tokenizer"),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'lab.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value


def check_data_config(options: dict):
    """The typed `data` group: a synthetic task when `source` names one (conf/data/star_graph.yaml), else a text corpus."""
    return (validate_synthetic_config if options.get("source") in TASKS else validate_data_config)(**options)


def build_datamodule(options: dict):
    """The DataModule of the `data` group: a synthetic task's or a text corpus's."""
    from lab.data.datamodule import LMDataModule
    from lab.data.synthetic import SyntheticDataModule

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

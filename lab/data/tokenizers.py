"""Tokenizers: a small protocol, a byte tokenizer, a cached byte-level BPE, a symbol tokenizer, and the registry of
`data.tokenizer` kinds (`TOKENIZER_KINDS`: how each is checked, built, rebuilt from a manifest, turned into transformers').

The byte and BPE tokenizers are lossless on any UTF-8 text. `SymbolTokenizer` (the synthetic
tasks': node ids and separators) maps whitespace-separated symbols of a fixed list to ids and
is named completely by its identity, so checkpoints and lab-generate rebuild it from the manifest. `decode` skips special ids (BOS, EOS,
PAD, and for BPE any id the trained vocabulary does not have).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import tokenizers as hf
from tokenizers import decoders, models, pre_tokenizers, trainers

from lab.errors import ConfigError, is_int, require

N_BYTES = 256
N_SPECIALS = 3  # BOS, EOS, PAD
BYTE_VOCAB_SIZE = N_BYTES + N_SPECIALS
MIN_BPE_VOCAB = BYTE_VOCAB_SIZE  # a BPE vocabulary holds at least every byte and the specials
BPE_SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>")


@runtime_checkable
class Tokenizer(Protocol):
    vocab_size: int  # the model's embedding size; every id is < vocab_size
    bos_id: int
    eos_id: int
    pad_id: int
    identity: dict  # kind, vocab_size, and for BPE a sha256 of the trained tokenizer

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """int32 ids per text, no specials added (the packer appends EOS)."""
        ...

    def token_byte_lengths(self) -> np.ndarray:
        """[vocab_size] int64: UTF-8 bytes each id stands for (0 for specials and unused ids)."""
        ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; BOS=256, EOS=257, PAD=258."""

    vocab_size = BYTE_VOCAB_SIZE
    bos_id, eos_id, pad_id = N_BYTES, N_BYTES + 1, N_BYTES + 2

    @property
    def identity(self) -> dict:
        return {"kind": "byte", "vocab_size": self.vocab_size}

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int32) for t in texts]

    def token_byte_lengths(self) -> np.ndarray:
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        lengths[:N_BYTES] = 1
        return lengths

    def decode(self, ids: Sequence[int]) -> str:
        # A cut inside a multi-byte character decodes to U+FFFD rather than failing.
        return bytes(int(i) for i in ids if 0 <= int(i) < N_BYTES).decode("utf-8", errors="replace")


class BPETokenizer:
    """Byte-level BPE (HF `tokenizers`) with BOS/EOS/PAD specials.

    `vocab_size` is the configured size. A tiny corpus may run out of merges before
    reaching it; the unused ids then stay unused (the model size follows the config,
    not the corpus). `identity["trained_vocab_size"]` records how many were learned.
    """

    def __init__(self, tokenizer: hf.Tokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        # Text that happens to contain "<|eos|>" must stay text, not become a special id.
        self._tokenizer.encode_special_tokens = True
        self.vocab_size = vocab_size
        self.bos_id, self.eos_id, self.pad_id = (tokenizer.token_to_id(s) for s in BPE_SPECIALS)
        trained = tokenizer.get_vocab_size(with_added_tokens=True)
        require(
            trained <= vocab_size,
            "data.vocab_size",
            f"the cached tokenizer has {trained} tokens, more than vocab_size {vocab_size}",
        )
        canonical = json.dumps(json.loads(tokenizer.to_str()), sort_keys=True)
        self.identity = {
            "kind": "bpe",
            "vocab_size": vocab_size,
            "trained_vocab_size": trained,
            "sha256": hashlib.sha256(canonical.encode("utf-8")).hexdigest(),
        }

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        tokenizer = hf.Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(BPE_SPECIALS),
            # All 256 byte symbols up front: no text can ever be out of vocabulary.
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer, vocab_size)

    @classmethod
    def from_file(cls, path: str | os.PathLike, vocab_size: int) -> BPETokenizer:
        return cls(hf.Tokenizer.from_file(str(path)), vocab_size)

    def save(self, path: str | os.PathLike) -> None:
        """Atomic write: DDP ranks may race to fill the same cache entry."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        os.close(fd)
        self._tokenizer.save(tmp)
        os.replace(tmp, path)

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

    def token_byte_lengths(self) -> np.ndarray:
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        specials = {self.bos_id, self.eos_id, self.pad_id}
        for token, index in self._tokenizer.get_vocab(with_added_tokens=True).items():
            # Byte-level BPE spells every byte as one printable character.
            lengths[index] = 0 if index in specials else len(token)
        return lengths

    def decode(self, ids: Sequence[int]) -> str:
        trained = self.identity["trained_vocab_size"]
        return self._tokenizer.decode([int(i) for i in ids if 0 <= int(i) < trained], skip_special_tokens=True)


class SymbolTokenizer:
    """Symbol i is id i; then BOS, EOS, PAD. Text is symbols separated by whitespace."""

    def __init__(self, symbols: Sequence[str]):
        self.symbols = tuple(symbols)
        require(len(set(self.symbols)) == len(self.symbols), "tokenizer", "symbols must be distinct")
        require(all(s and not any(c.isspace() for c in s) for s in self.symbols), "tokenizer", "a symbol is a non-empty word without spaces")
        self._ids = {symbol: i for i, symbol in enumerate(self.symbols)}
        self.bos_id, self.eos_id, self.pad_id = (len(self.symbols) + i for i in range(N_SPECIALS))
        self.vocab_size = len(self.symbols) + N_SPECIALS
        self.identity = {"kind": "symbols", "vocab_size": self.vocab_size, "symbols": list(self.symbols)}

    def encode(self, text: str) -> list[int]:
        words = text.split()
        unknown = [w for w in words if w not in self._ids]
        require(not unknown, "prompt", f"unknown symbol(s) {' '.join(sorted(set(unknown))[:5])}; this tokenizer knows {' '.join(self.symbols[:12])} …")
        return [self._ids[w] for w in words]

    def encode_symbols(self, symbols: Sequence[str]) -> list[int]:
        return [self._ids[s] for s in symbols]

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.asarray(self.encode(t), dtype=np.int32) for t in texts]

    def token_byte_lengths(self) -> np.ndarray:
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        lengths[: len(self.symbols)] = [len(s.encode("utf-8")) for s in self.symbols]
        return lengths

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.symbols[int(i)] for i in ids if 0 <= int(i) < len(self.symbols))


def bpe_cache_path(cache_dir: str | os.PathLike, fingerprint: str, vocab_size: int) -> Path:
    return Path(cache_dir) / "tokenizers" / f"bpe-{fingerprint[:24]}-v{vocab_size}.json"


# ---------------------------------------------------------------- the kinds: one entry each


@dataclass(frozen=True)
class TokenizerKind:
    """One value of `data.tokenizer`: how `data.vocab_size` is checked against it, how a run builds it, how a
    manifest's identity rebuilds it, its vocabulary size before the data is prepared (None: only after), and the
    transformers tokenizer it becomes in a Hugging Face folder (None: it has none)."""

    check: Callable[[int | None], None]
    build: Callable[[int | None, Iterable[str], str | os.PathLike | None, str, str | None], Tokenizer]
    from_identity: Callable[[dict, str | None], Tokenizer | None]
    vocab_before_setup: Callable[[int | None], int | None]
    transformers_form: Callable[[dict, str | None], Any] = lambda identity, bpe_json: None


def check_byte_vocab(vocab_size: int | None) -> None:
    require(vocab_size is None or vocab_size == ByteTokenizer.vocab_size, "data.vocab_size",
            f"the byte tokenizer has a fixed vocab_size of {ByteTokenizer.vocab_size}; leave it null, got {vocab_size}")


def check_bpe_vocab(vocab_size: int | None) -> None:
    require(is_int(vocab_size), "data.vocab_size", f"the bpe tokenizer needs an integer vocab_size ≥ {MIN_BPE_VOCAB}, got {vocab_size!r}")
    require(vocab_size >= MIN_BPE_VOCAB, "data.vocab_size",
            f"BPE vocab_size must be ≥ {MIN_BPE_VOCAB} ({N_BYTES} bytes + {N_SPECIALS} specials), got {vocab_size}")


def check_hf_vocab(vocab_size: int | None) -> None:
    require(vocab_size is None, "data.vocab_size", f"the hf tokenizer has its own vocabulary; leave it null, got {vocab_size}")


def build_bpe(vocab_size: int, train_texts: Iterable[str], cache_dir, fingerprint: str, tokenizer_path: str | None) -> BPETokenizer:
    """Loaded from `cache_dir`, or trained on `train_texts` (consumed only then) and cached."""
    if cache_dir is None:
        return BPETokenizer.train(train_texts, vocab_size)
    cached = bpe_cache_path(cache_dir, fingerprint, vocab_size)
    if cached.is_file():
        return BPETokenizer.from_file(cached, vocab_size)
    tokenizer = BPETokenizer.train(train_texts, vocab_size)
    tokenizer.save(cached)
    return tokenizer


def bpe_transformers_form(identity: dict, bpe_json: str | None):
    """The run's BPE as transformers' fast tokenizer, from the JSON the checkpoint carries (None without it)."""
    if not bpe_json:
        return None
    from transformers import PreTrainedTokenizerFast

    bos, eos, pad = BPE_SPECIALS
    return PreTrainedTokenizerFast(tokenizer_object=hf.Tokenizer.from_str(bpe_json), bos_token=bos, eos_token=eos, pad_token=pad)


def build_hf(vocab_size, train_texts, cache_dir, fingerprint: str, tokenizer_path: str | None):
    from lab.data.hf_tokenizer import HFTokenizer

    require(tokenizer_path is not None, "data.tokenizer_path", "data.tokenizer=hf needs the tokenizer's local folder")
    return HFTokenizer(tokenizer_path)


def hf_from_identity(identity: dict, bpe_json: str | None = None):
    """The model's own tokenizer from the folder the identity names, refused when its sha256 differs."""
    from lab.data.hf_tokenizer import HFTokenizer

    tokenizer = HFTokenizer(identity["path"], "tokenizer")
    require(tokenizer.identity["sha256"] == identity.get("sha256"), "tokenizer",
            f"the tokenizer at {identity['path']} is not the one the run used (sha256 differs)")
    return tokenizer


TOKENIZER_KINDS: dict[str, TokenizerKind] = {
    "byte": TokenizerKind(check=check_byte_vocab, build=lambda *_: ByteTokenizer(), from_identity=lambda identity, bpe_json: ByteTokenizer(),
                          vocab_before_setup=lambda vocab_size: BYTE_VOCAB_SIZE),
    "bpe": TokenizerKind(check=check_bpe_vocab, build=build_bpe,
                         from_identity=lambda identity, bpe_json: BPETokenizer(hf.Tokenizer.from_str(bpe_json), identity["vocab_size"]) if bpe_json else None,
                         vocab_before_setup=lambda vocab_size: vocab_size, transformers_form=bpe_transformers_form),
    # hf: a pretrained model's own (lab/data/hf_tokenizer.py, set by model=hf)
    "hf": TokenizerKind(check=check_hf_vocab, build=build_hf, from_identity=hf_from_identity, vocab_before_setup=lambda vocab_size: None,
                        transformers_form=lambda identity, bpe_json: hf_from_identity(identity).transformers_tokenizer),
}
# Kinds a manifest can name that no `data.tokenizer` value builds: the synthetic tasks' symbols (named by their identity).
IDENTITY_ONLY = {"symbols": lambda identity, bpe_json: SymbolTokenizer(identity["symbols"])}


def tokenizer_from_identity(identity: dict, bpe_json: str | None = None) -> Tokenizer | None:
    """The tokenizer an identity (a manifest's `tokenizer`) names; a BPE also needs its JSON. None: not enough."""
    readers = {**{name: kind.from_identity for name, kind in TOKENIZER_KINDS.items()}, **IDENTITY_ONLY}
    reader = readers.get(identity.get("kind"))
    return None if reader is None else reader(identity, bpe_json)


def check_tokenizer_config(kind: str, vocab_size: int | None) -> None:
    """Cheap checks, run at DataModule construction so the CLI fails before any work."""
    if kind not in TOKENIZER_KINDS:
        raise ConfigError("data.tokenizer", f"unknown {kind!r}; allowed: {', '.join(TOKENIZER_KINDS)}")
    TOKENIZER_KINDS[kind].check(vocab_size)


def build_tokenizer(
    kind: str,
    vocab_size: int | None,
    train_texts: Iterable[str],
    cache_dir: str | os.PathLike | None,
    fingerprint: str,
    tokenizer_path: str | None = None,
) -> Tokenizer:
    """The run's tokenizer of `kind` (`train_texts` is consumed only when a BPE has to be trained)."""
    check_tokenizer_config(kind, vocab_size)
    return TOKENIZER_KINDS[kind].build(vocab_size, train_texts, cache_dir, fingerprint, tokenizer_path)

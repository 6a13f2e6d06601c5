"""A pretrained model's own tokenizer (transformers' AutoTokenizer, local files only) behind the
harness's Tokenizer protocol: `data.tokenizer=hf`, chosen for every data source by `model=hf`.

EOS comes from the tokenizer (the packer ends every document with it); a tokenizer without BOS
or PAD uses EOS in their place (padding rows are inactive, so the id never reaches a loss).
The identity carries a sha256 of the tokenizer's full definition, so a checkpoint names it exactly.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lab.errors import ConfigError, require


def tokenizer_sha256(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    definition = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    specials = json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str)
    return hashlib.sha256((definition + specials).encode("utf-8")).hexdigest()


class HFTokenizer:
    def __init__(self, path: str, field: str = "model.tokenizer_path"):
        from transformers import AutoTokenizer

        folder = Path(path).expanduser()
        require(folder.is_dir(), field, f"no such folder: {path} (tokenizers are read from local folders; the hub is unreachable)")
        try:
            self._transformers = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError, TypeError) as error:
            raise ConfigError(field, f"no tokenizer in {folder} ({str(error).splitlines()[0][:160]})") from None
        eos = self._transformers.eos_token_id
        require(eos is not None, field, f"the tokenizer in {folder} has no EOS token (documents are packed EOS-terminated)")
        self.vocab_size = len(self._transformers)
        self.eos_id = eos
        self.bos_id = eos if self._transformers.bos_token_id is None else self._transformers.bos_token_id
        self.pad_id = eos if self._transformers.pad_token_id is None else self._transformers.pad_token_id
        self.identity = {"kind": "hf", "path": str(folder.resolve()), "vocab_size": self.vocab_size, "sha256": tokenizer_sha256(self._transformers)}

    @property
    def transformers_tokenizer(self):
        return self._transformers

    def encode(self, text: str) -> list[int]:
        return self._transformers(text, add_special_tokens=False)["input_ids"]

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        ids = self._transformers(list(texts), add_special_tokens=False)["input_ids"]
        return [np.asarray(row, dtype=np.int32) for row in ids]

    def token_byte_lengths(self) -> np.ndarray:
        pieces = self._transformers.batch_decode([[i] for i in range(self.vocab_size)])
        lengths = np.asarray([len(piece.encode("utf-8")) for piece in pieces], dtype=np.int64)
        lengths[list(set(self._transformers.all_special_ids))] = 0
        return lengths

    def decode(self, ids: Sequence[int]) -> str:
        return self._transformers.decode([int(i) for i in ids if 0 <= int(i) < self.vocab_size], skip_special_tokens=True)

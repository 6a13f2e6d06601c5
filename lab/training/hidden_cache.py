"""Head-only training from a hidden-state cache (`hidden_cache=true`, needs `head.trunk_grad=frozen`).

A frozen trunk maps a packed training row to the same hidden state at every epoch, so it runs once:
`open_hidden_cache` passes the training rows through the trunk in row order and stores, per row, what
every head reads from it — the trunk's output before the final norm, `[S, d]` in the model's dtype —
beside the row's own columns (tokens, active, segment_ids, position_ids, and target_mask /
input_tokens when the data has them), and the trunk's own next-token loss and top-1 hit at every row
([S-1] each, in the loss dtype). Training then reads `CachedRows`: each batch carries `trunk_hidden`
[B, S, d] and `MTPModel.forward` uses it in place of running the trunk; for a head whose horizon 1 is
the trunk's own prediction (medusa with the shared lm_head, deepseek), the stored loss
and hits stand in for horizon 1's V-wide logits, which could not change while the trunk is frozen.

What stays live in a cached step, per head: the heads themselves; the shared final norm and vocabulary
projection (frozen, but every horizon ≥ 2's logits need them, and horizon 1's when a head has its own); DeepSeek's teacher-token embeddings (a row
lookup into the frozen embedding); a distilled target's teacher distribution, projected from the
cached horizon-1 rows (exact, no truncation). Validation and decoding always run the trunk.

An entry is a folder `<root>/<key>/` whose key hashes the trunk's weights (every tensor of its state),
its dtype and attention implementation, and every column of every training row, so other data or
other weights never meet a stale entry. It is written under a temporary name and renamed into place
when complete (no half-written entry is ever read), and each file's sha256 is checked when it is
opened: a damaged entry is refused in one line, never used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from filelock import FileLock
from torch.utils.data import Dataset, default_collate

from lab.errors import ConfigError, require
from lab.objective.backward import project, top1_hits

CACHE_FORMAT = 2  # 2: the trunk's next-token loss and hits are stored too
HIDDEN = "trunk_hidden"  # the batch key the cached rows add ([B, S, d]; lab/model/mtp.py reads it)
# The trunk's own next-token loss and top-1 hit per row ([B, S-1] each; lab/model/mtp.py: with_known_next_token)
NEXT_TOKEN_LOSS, NEXT_TOKEN_HIT = "next_token_loss", "next_token_hit"
# How a trunk dtype is stored in a .npy file (numpy has no bfloat16: its bits go in as int16).
STORAGE = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16, torch.bfloat16: np.int16}
DTYPE_NAMES = {str(dtype).removeprefix("torch."): dtype for dtype in STORAGE}
HASH_CHUNK = 1 << 24


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def trunk_fingerprint(model, module=None) -> dict:
    """What the cached states are a function of on the model side: every trunk tensor (every tensor of `module`
    when given, e.g. the whole model), the dtype, the attention."""
    digest = hashlib.sha256()
    for name, tensor in sorted((module or model.trunk).state_dict().items()):
        digest.update(name.encode("utf-8"))
        digest.update(str(tensor.dtype).encode("utf-8"))
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy())  # hashed in place, no bytes copy
    return {"trunk": type(model.trunk).__name__, "weights_sha256": digest.hexdigest(),
            "attn_implementation": getattr(model.model_cfg, "attn_implementation", None)}


def rows_fingerprint(rows: Dataset) -> dict:
    """Every column of every row, in order: the data side of the key (a pass over the token data, no model)."""
    digest = hashlib.sha256()
    columns = None
    for index in range(len(rows)):
        row = rows[index]
        columns = columns or sorted(row)
        for name in columns:
            digest.update(row[name].numpy().tobytes())
    return {"n_rows": len(rows), "columns": columns, "rows_sha256": digest.hexdigest()}


def entry_key(description: dict) -> str:
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode("utf-8")).hexdigest()[:32]


class CachedRows(Dataset):
    """The training rows of one cache entry: each item is the row's columns ([S] each) plus `trunk_hidden` [S, d].
    Memory-mapped; pickles by folder (DataLoader workers re-open the files)."""

    def __init__(self, folder: Path, meta: dict):
        self.folder, self.meta = Path(folder), meta
        self.dtype = DTYPE_NAMES[meta["dtype"]]
        self._arrays: dict[str, np.ndarray] | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            names = [*self.meta["columns"], HIDDEN, NEXT_TOKEN_LOSS, NEXT_TOKEN_HIT]
            self._arrays = {name: np.load(self.folder / f"{name}.npy", mmap_mode="r") for name in names}
        return self._arrays

    def __len__(self) -> int:
        return self.meta["n_rows"]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range for {len(self)} cached rows")
        arrays = self.arrays()
        row = {name: torch.from_numpy(np.array(arrays[name][index])) for name in [*self.meta["columns"], NEXT_TOKEN_LOSS, NEXT_TOKEN_HIT]}  # [S] / [S-1]
        row[HIDDEN] = torch.from_numpy(np.array(arrays[HIDDEN][index])).view(self.dtype)  # [S, d]
        return row

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_arrays": None}


def open_hidden_cache(model, rows: Dataset, root: str | os.PathLike, batch_size: int = 16) -> tuple[CachedRows, dict]:
    """The cached rows of `rows` under `model`'s frozen trunk (built on a miss), and a record of what happened."""
    require(model.head_cfg.trunk_grad == "frozen", "hidden_cache",
            f"caches a frozen trunk's states; needs head.trunk_grad=frozen, got {model.head_cfg.trunk_grad}")
    root = Path(root).expanduser()
    started = time.perf_counter()
    description = {"format": CACHE_FORMAT, "model": trunk_fingerprint(model), "rows": rows_fingerprint(rows)}

    def write(folder: Path) -> None:
        was_training = model.trunk.training
        model.trunk.eval()  # as a frozen trunk runs in training (no dropout)
        try:
            write_entry(model, rows, folder, description, batch_size)
        finally:
            model.trunk.train(was_training)

    folder, meta, built = open_entry(root, description, write, field="hidden_cache", what="the cache")
    record = {"key": folder.name, "path": str(folder), "built": built, "rows": meta["n_rows"], "dtype": meta["dtype"],
              "bytes": sum(f.stat().st_size for f in folder.iterdir()), "seconds": round(time.perf_counter() - started, 3)}
    return CachedRows(folder, meta), record


def open_entry(root: Path, description: dict, write, *, field: str, what: str) -> tuple[Path, dict, bool]:
    """(folder, verified meta, built now) of the entry `description` keys under `root`; on a miss `write(folder)`
    writes it, one builder per entry (a file lock: DDP ranks, parallel sweep jobs). Shared by every cache of
    derived training data (this one, lab/decode/generated_rows.py)."""
    key = entry_key(description)
    folder = root / key
    try:
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(root / f"{key}.lock")):
            built = not folder.is_dir()
            if built:
                write(folder)
    except PermissionError as error:
        raise ConfigError(field, f"cannot write {what} under {root} ({error.strerror}): set paths.cache_dir to a writable folder") from None
    return folder, verified_meta(folder, key, field), built


@torch.no_grad()
def write_entry(model, rows: Dataset, folder: Path, description: dict, batch_size: int) -> None:
    """Run the trunk over `rows` in order and write the entry; the folder appears only once it is complete."""
    from lab.model.mtp import input_tokens

    n_rows = len(rows)
    partial = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.partial-"))
    try:
        arrays: dict[str, np.ndarray] = {}
        dtype = None
        for start in range(0, n_rows, batch_size):
            batch = default_collate([rows[i] for i in range(start, min(start + batch_size, n_rows))])  # each [b, S]
            ctx = model.trunk.attention_context(batch["segment_ids"], batch["position_ids"], batch["active"])
            hidden = model.trunk(input_tokens(batch), ctx)  # [b, S, d], before the final norm
            derived = dict(zip((NEXT_TOKEN_LOSS, NEXT_TOKEN_HIT), trunk_next_token_rows(model.trunk, hidden, batch["tokens"])))
            if not arrays:
                dtype = hidden.dtype
                arrays = {name: np.lib.format.open_memmap(partial / f"{name}.npy", mode="w+", dtype=value.numpy().dtype,
                                                          shape=(n_rows, *value.shape[1:])) for name, value in {**batch, **derived}.items()}
                arrays[HIDDEN] = np.lib.format.open_memmap(partial / f"{HIDDEN}.npy", mode="w+", dtype=STORAGE[dtype],
                                                           shape=(n_rows, *hidden.shape[1:]))
            stop = start + hidden.shape[0]
            for name, value in {**batch, **derived}.items():
                arrays[name][start:stop] = value.numpy()
            arrays[HIDDEN][start:stop] = hidden.cpu().contiguous().view(torch.int16 if dtype == torch.bfloat16 else dtype).numpy()
        for array in arrays.values():
            array.flush()
        del arrays
        files = sorted(p.name for p in partial.iterdir())
        meta = {**description, "key": folder.name, "n_rows": n_rows, "columns": description["rows"]["columns"],
                "dtype": str(dtype).removeprefix("torch."), "sha256": {name: sha256_file(partial / name) for name in files}}
        (partial / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def trunk_next_token_rows(trunk, hidden: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, S, d] trunk rows, [b, S] tokens -> ([b, S-1] loss, [b, S-1] bool hit) of the trunk's own next-token
    prediction at every row (horizon 1 of a head that keeps it), computed as a training step would
    (`project`: the loss dtype). One packed row at a time: [S-1, V] logits, never [b, S-1, V]."""
    losses, hits = [], []
    for rows, labels in zip(hidden[:, :-1], tokens[:, 1:]):  # [S-1, d], [S-1]: row t predicts tokens[t+1]
        logits = project(rows, trunk.final_norm, trunk.final_norm.weight, trunk.unembedding)  # [S-1, V]
        losses.append(F.cross_entropy(logits, labels, reduction="none")), hits.append(top1_hits(logits, labels))
    return torch.stack(losses), torch.stack(hits)  # [b, S-1] each


def verified_meta(folder: Path, key: str, field: str = "hidden_cache") -> dict:
    """The entry's meta after checking every file against its recorded sha256; one line naming the damage (as `field`) otherwise."""
    remedy = f"delete {folder} to rebuild it"
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(field, f"the cache entry's meta.json is unreadable ({error}); {remedy}") from None
    require(meta.get("key") == key, field, f"the cache entry {folder} describes another key ({meta.get('key')}); {remedy}")
    for name, expected in meta["sha256"].items():
        path = folder / name
        require(path.is_file(), field, f"the cache entry lacks {name}; {remedy}")
        require(sha256_file(path) == expected, field, f"{path} does not match its recorded sha256 (damaged); {remedy}")
    return meta


def train_from_hidden_cache(datamodule, model, root: str | os.PathLike) -> dict:
    """`hidden_cache=true`: the datamodule's training batches come from the cache of its training rows
    (opened or built now, before the run folder exists); returns what `open_hidden_cache` records."""
    rows, record = open_hidden_cache(model, datamodule.training_rows, root, datamodule.config.batch_size)
    datamodule.train_from(rows)
    verb = "built" if record["built"] else "read"
    print(f"hidden cache: {verb} {record['rows']} rows ({record['bytes'] / 2**20:.1f} MiB, {record['dtype']}) in "
          f"{record['seconds']:.1f} s: {record['path']}", flush=True)
    return record

"""Training rows the model writes itself (`train_rows=generated`, docs/generated-rows.md).

Draft heads are judged on how often they guess what the model will say, but a corpus row shows them
what a person wrote: at row t the next token t+1 is the author's, not the model's, so a horizon-2 head
must spread its bet over every t+1 the author might have written. Medusa-2, EAGLE and the speculators
train on the model's own outputs instead. Here each training row keeps its first `prompt_tokens`
tokens and the rest becomes the model's own continuation, sampled at `temperature` (0: greedy) with
end-of-sequence suppressed, so every row stays full. The rows have one segment (positions 0..S-1);
a prompt that spans a document boundary in the packed row is continued as one text.

Generating is one batched decoding pass over the training rows, done once: the rows are stored under
`<cache>/<key>/` (the key hashes the trunk's weights, the corpus rows and the settings), written under
a temporary name and renamed into place when complete, each file's sha256 checked when read, one
builder per entry (a file lock: DDP ranks and parallel sweep jobs share it). Validation and the
decoding evaluation keep the corpus's held-out rows: the heads are measured where they were not trained.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm import tqdm

from lab.data.train_rows import TrainRowsConfig
from lab.errors import require
from lab.training.hidden_cache import open_entry, rows_fingerprint, sha256_file, trunk_fingerprint

GENERATED_FORMAT = 1


class GeneratedRows(Dataset):
    """Rows of one stored entry: tokens [S] (prompt + the model's continuation), one segment, every slot active."""

    def __init__(self, tokens: np.ndarray):
        self.tokens = tokens  # [N, S], memory-mapped

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"row {index} out of range for {len(self)} generated rows")
        tokens = torch.from_numpy(np.array(self.tokens[index], dtype=np.int64))  # [S]
        seq_len = tokens.numel()
        return {"tokens": tokens, "active": torch.ones(seq_len, dtype=torch.bool),
                "segment_ids": torch.zeros(seq_len, dtype=torch.int64), "position_ids": torch.arange(seq_len)}


def open_generated_rows(model, rows: Dataset, config: TrainRowsConfig, seed: int, root: str | os.PathLike) -> tuple[GeneratedRows, dict]:
    """The generated counterpart of `rows` under `model` (built on a miss) and a record of what happened."""
    seq_len = rows[0]["tokens"].numel()
    require(config.prompt_tokens < seq_len, "train_rows.prompt_tokens",
            f"must be below the rows' length {seq_len} so the model writes part of each row, got {config.prompt_tokens}")
    root = Path(root).expanduser()
    started = time.perf_counter()
    # the batch size too: each batch draws from its own seed, so other batches draw other tokens
    settings = {"prompt_tokens": config.prompt_tokens, "temperature": float(config.temperature), "seed": int(seed),
                "batch_size": config.batch_size}
    # the writer: the trunk, or the whole model when horizon 1 runs a head block or projection of its own
    writer = trunk_fingerprint(model, None if next_token_is_the_trunks(model) else model)
    description = {"format": GENERATED_FORMAT, "model": writer, "rows": rows_fingerprint(rows), "settings": settings}
    folder, _, built = open_entry(root, description, lambda folder: write_generated(model, rows, config, seed, folder, description),
                                  field="train_rows", what="generated rows")
    tokens = np.load(folder / "tokens.npy", mmap_mode="r")
    record = {"key": folder.name, "path": str(folder), "built": built, "rows": int(tokens.shape[0]), **settings,
              "seconds": round(time.perf_counter() - started, 3)}
    return GeneratedRows(tokens), record


def write_generated(model, rows: Dataset, config: TrainRowsConfig, seed: int, folder: Path, description: dict) -> None:
    """Continue every row's prompt in batches and write the entry; the folder appears only once it is complete."""
    n_rows, seq_len = len(rows), rows[0]["tokens"].numel()
    new_tokens = seq_len - config.prompt_tokens
    partial = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.partial-"))
    try:
        tokens = np.lib.format.open_memmap(partial / "tokens.npy", mode="w+", dtype=np.int64, shape=(n_rows, seq_len))
        generator = torch.Generator().manual_seed(int(seed))
        was_training = model.training
        model.eval()
        try:
            print(f"training rows: the model continues {n_rows} rows by {new_tokens} tokens each after {config.prompt_tokens} "
                  f"prompt tokens (temperature {config.temperature:g}), {config.batch_size} at a time; stored for later runs", flush=True)
            for start in tqdm(range(0, n_rows, config.batch_size), desc="generating rows", unit="batch", file=sys.stdout, mininterval=5):
                stop = min(start + config.batch_size, n_rows)
                prompts = torch.stack([rows[i]["tokens"][: config.prompt_tokens] for i in range(start, stop)])  # [b, P]
                continuation = continue_prompts(model, prompts, new_tokens, config.temperature, generator)  # [b, S-P]
                tokens[start:stop] = torch.cat([prompts, continuation], dim=1).numpy()  # [b, S]
        finally:
            model.train(was_training)
        tokens.flush()
        del tokens
        meta = {**description, "key": folder.name, "n_rows": n_rows, "sha256": {"tokens.npy": sha256_file(partial / "tokens.npy")}}
        (partial / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        os.replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


@torch.no_grad()
def continue_prompts(model, prompts: torch.Tensor, new_tokens: int, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """[b, P] prompts -> [b, new_tokens] of the model's own continuation (its next-token path); no stop at
    end-of-sequence. A transformers trunk whose next-token path is its own runs transformers' batched `generate`;
    every other model decodes through lab.decode (a transformers trunk one prompt at a time)."""
    if model.trunk.transformers_model is not None and next_token_is_the_trunks(model):
        return continue_with_transformers(model.trunk.transformers_model, prompts, new_tokens, temperature, generator)
    from lab.decode import generate
    from lab.decode.batched import batch_cache_class

    requests = [prompts] if batch_cache_class(model).any_requests else prompts.unbind(0)  # one batch where the caches allow
    outputs = []
    for request in requests:
        decoded = generate(model, request, new_tokens, temperature=temperature, generator=generator)
        outputs += [g.tokens for g in decoded] if isinstance(decoded, list) else [decoded.tokens]
    return torch.tensor(outputs, dtype=torch.long)  # [b, new_tokens]


def next_token_is_the_trunks(model) -> bool:
    """Horizon 1 is the trunk's output through the trunk's own projection (medusa with the shared lm_head,
    deepseek, ntp), so the transformers model alone decodes what the MTP model decodes."""
    path = model.head.next_token_path()
    return path.blocks == () and path.projection is None


def continue_with_transformers(hf_model, prompts: torch.Tensor, new_tokens: int, temperature: float, generator: torch.Generator) -> torch.Tensor:
    """transformers' own `generate`, sampling exactly softmax(logits / T) (no top-k, top-p or penalties from the
    model's generation config), end-of-sequence suppressed by `min_new_tokens`; its draws come from torch's
    global generator, seeded here from `generator` inside a forked RNG state so the caller's stream is untouched."""
    from transformers import GenerationConfig

    sampled = temperature > 0
    eos = hf_model.config.eos_token_id
    settings = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=sampled,
                                temperature=float(temperature) if sampled else None, top_k=0 if sampled else None,
                                top_p=1.0 if sampled else None, eos_token_id=eos, pad_token_id=eos if isinstance(eos, int) else None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
        out = hf_model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=settings)  # [b, P+new]
    return out[:, prompts.shape[1]:]  # [b, new_tokens]


def train_from_generated_rows(datamodule, model, config: TrainRowsConfig, seed: int, root: str | os.PathLike) -> dict:
    """`train_rows=generated`: the datamodule's training rows become the model's continuations of them
    (opened or built now, before the run folder exists); returns what `open_generated_rows` records."""
    rows, record = open_generated_rows(model, datamodule.train_rows, config, seed, root)
    datamodule.train_from(rows)
    verb = "generated" if record["built"] else "read"
    print(f"training rows: {verb} {record['rows']} rows continued by the model after {config.prompt_tokens} prompt tokens "
          f"(temperature {config.temperature:g}) in {record['seconds']:.1f} s: {record['path']}", flush=True)
    return record

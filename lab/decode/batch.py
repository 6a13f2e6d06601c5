"""Batched requests: a [B, P] tensor or a list of prompts in, one `Generation` per prompt out.

Plain rows: lab.decode.batched (left-padded caches, per-row positions and masks); speculative
rows with independent heads: lab.decode.batched_speculative. Each row passes the same checks
as a single request (lab.decode.request).
"""

from __future__ import annotations

import torch

from lab.decode.batched import batch_cache_class, decode_rows
from lab.decode.batched_speculative import speculative_rows
from lab.decode.request import Generation, check_request
from lab.errors import require
from lab.decode_core.sampling import TokenChooser


def is_batch(prompt) -> bool:
    """A [B, P] tensor or a list/tuple of 1-D prompts (a plain [P] tensor is one request)."""
    return isinstance(prompt, (list, tuple)) or (torch.is_tensor(prompt) and prompt.dim() == 2)


def prompt_rows(prompt) -> list[torch.Tensor]:
    """The batch as a list of 1-D LongTensors (one per request)."""
    rows = list(prompt.unbind(0)) if torch.is_tensor(prompt) else [torch.as_tensor(p) for p in prompt]
    require(len(rows) >= 1, "prompt", "a batch needs at least one prompt")
    return rows


def generate_batch(model, prompt, max_new_tokens: int, *, temperature: float = 0.0, top_k: int | None = None, speculative: bool = False,
                   draft_steps: int | None = None, eos: int | None = None, generator=None, stop=None) -> list:
    """Every prompt of the batch, plain or speculative; one Generation per prompt, in order.

    `generator`: None, one torch.Generator that all rows draw from in turn, or a list with one per prompt.
    `stop` (plain rows): a row also ends once `stop(its tokens so far)` is True.
    A transformers trunk (model=hf) decodes plain batches of prompts of one length (n samples of one prompt).
    """
    rows = prompt_rows(prompt)
    if not batch_cache_class(model).any_requests:
        require(not speculative, "speculative",
                "batched speculative requests need the harness's GPT trunk; a transformers trunk (model=hf) drafts for one prompt at a time")
        require(len({row.numel() for row in rows}) == 1, "prompt",
                "a transformers trunk (model=hf) batches prompts of one length only; pass prompts of different lengths one at a time")
    require(stop is None or not speculative, "stop", "applies to plain batches; speculative rows end at EOS or their budget")
    for row in rows:
        check_request(model, row, max_new_tokens, temperature, top_k, draft_steps)
    generators = list(generator) if isinstance(generator, (list, tuple)) else [generator] * len(rows)
    require(len(generators) == len(rows), "generator", f"a list of generators needs one per prompt: {len(generators)} for {len(rows)} prompts")
    choosers = [TokenChooser(temperature, top_k, g) for g in generators]
    model.eval()
    with torch.no_grad():
        if speculative:
            decoded = speculative_rows(model, rows, max_new_tokens, choosers, eos, draft_steps)
        else:
            decoded = decode_rows(model, rows, max_new_tokens, choosers, eos, stop)
    return [Generation(out, stats) for out, stats in decoded]

"""`generate`: plain and speculative decoding of one sequence with KV caches.

Both run the carried-frontier schedule of M7.6 §0x09. Prefill runs the prompt and picks
the first new token f (the frontier: emitted, not yet in the target cache). Each round
then proposes m drafts after f (m = 0 in plain decoding), runs one target pass over
[f, drafts], accepts a prefix of the drafts exactly (lab.decode.acceptance), emits the
accepted drafts plus the correction or bonus token, commits the target rows of f and the
accepted drafts, and carries the last emitted token as the next frontier. Plain decoding
is the m = 0 case, so both paths share every line that touches the target cache.

Positions start at 0 at the first prompt token, as for a document in training.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from lab.decode.acceptance import select
from lab.decode.batched import generate_batch, is_batch
from lab.decode.ledger import acceptance_conventions
from lab.decode.proposers import build_proposer
from lab.decode.sampling import TokenChooser
from lab.decode.target import CachedModel
from lab.errors import ConfigError, require


@dataclass
class Generation:
    tokens: list[int]  # new tokens only, up to and including EOS
    stats: dict = field(default_factory=dict)


def check_request(model, prompt: torch.Tensor, max_new_tokens: int, temperature: float, top_k, draft_steps) -> None:
    vocab = model.model_cfg.vocab_size
    require(prompt.dim() == 1 and prompt.numel() >= 1, "prompt", f"must be a non-empty 1-D LongTensor of token ids, got shape {tuple(prompt.shape)}")
    require(not prompt.is_floating_point() and not prompt.is_complex(), "prompt", f"must hold integer token ids, got {prompt.dtype}")
    require(bool(((prompt >= 0) & (prompt < vocab)).all()), "prompt", f"token ids must lie in [0, {vocab})")
    require(isinstance(max_new_tokens, int) and max_new_tokens >= 0, "max_new_tokens", f"must be an int ≥ 0, got {max_new_tokens!r}")
    require(temperature >= 0, "temperature", f"must be ≥ 0 (0 = greedy), got {temperature}")
    require(top_k is None or (isinstance(top_k, int) and top_k >= 1), "top_k", f"must be None or an int ≥ 1, got {top_k!r}")
    require(draft_steps is None or (isinstance(draft_steps, int) and draft_steps >= 1), "draft_steps", f"must be None or an int ≥ 1, got {draft_steps!r}")


def generate(
    model,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    speculative: bool = False,
    draft_steps: int | None = None,
    eos: int | None = None,
    generator: torch.Generator | None = None,
) -> Generation | list[Generation]:
    """Continue `prompt` ([P] token ids) by up to `max_new_tokens` tokens (DESIGN.md §10).

    A batch (a [B, P] tensor or a list of 1-D prompts of any lengths) returns one Generation per
    prompt (lab.decode.batched; plain decoding only).
    """
    if is_batch(prompt):
        return generate_batch(model, prompt, max_new_tokens, temperature=temperature, top_k=top_k, speculative=speculative,
                              draft_steps=draft_steps, eos=eos, generator=generator)
    check_request(model, prompt, max_new_tokens, temperature, top_k, draft_steps)
    model.eval()
    with torch.no_grad():
        return Decoder(model, TokenChooser(temperature, top_k, generator), speculative, draft_steps, eos).run(prompt.tolist(), max_new_tokens)


class Decoder:
    def __init__(self, model, chooser: TokenChooser, speculative: bool, draft_steps: int | None, eos: int | None):
        self.state = CachedModel(model)
        self.chooser, self.eos = chooser, eos
        if speculative and not model.head_cfg.contiguous_offsets:
            raise ConfigError("speculative", f"head.offsets={list(model.head.offsets)} leave draft slots without a head; "
                              "speculative decoding needs contiguous offsets [1..K] (use speculative=False)")
        self.proposer = build_proposer(self.state, draft_steps) if speculative else None
        if speculative and (self.proposer is None or self.proposer.max_drafts < 1):
            raise ConfigError(
                "speculative", f"head '{model.head_cfg.name}' with K={model.k} has no draft heads; use a K ≥ 2 head or speculative=False"
            )
        self.stats = {
            "target_forwards": 0, "rounds": 0, "emitted": 0, "fallbacks": 0,
            "proposed_by_position": [0] * (self.proposer.max_drafts if self.proposer else 0),
            "accepted_by_position": [0] * (self.proposer.max_drafts if self.proposer else 0),
            "emitted_by_round": [], "proposed_by_round": [], "accepted_by_round": [], "stopped_by_round": [],
            "prefill_time_s": 0.0, "draft_time_s": 0.0, "verify_time_s": 0.0,
        }

    def target_pass(self, tokens: list[int]):
        """One target forward; the next-token path's time is verification time."""
        start = time.perf_counter()
        result = self.state.forward(tokens)
        self.stats["target_forwards"] += 1
        return result, time.perf_counter() - start

    def after_pass(self, result, kept: int) -> None:
        start = time.perf_counter()
        if self.proposer is not None:
            self.proposer.after_verify(result, kept)  # the draft heads' share of the pass
        self.stats["draft_time_s"] += time.perf_counter() - start
        self.state.commit(kept)

    def run(self, prompt: list[int], max_new_tokens: int) -> Generation:
        begin = time.perf_counter()
        out: list[int] = []
        if max_new_tokens > 0:
            result, seconds = self.target_pass(prompt)  # prefill
            frontier, _ = self.chooser.choose(result.logits[-1])
            self.stats["prefill_time_s"] += seconds
            self.after_pass(result, len(prompt))
            out.append(frontier)
            tokens = list(prompt)  # tokens with committed target rows
            while len(out) < max_new_tokens and out[-1] != self.eos:
                frontier = self.round(tokens, frontier, out, max_new_tokens - len(out))
        elapsed = time.perf_counter() - begin
        self.stats.update(
            emitted=len(out),
            kv_bytes=dict(self.state.caches.peak_bytes),
            total_time_s=elapsed,
            tokens_per_s=len(out) / elapsed if elapsed > 0 else float("nan"),
            tokens_per_forward=len(out) / self.stats["target_forwards"] if self.stats["target_forwards"] else float("nan"),
            **acceptance_conventions(self.stats["proposed_by_round"], self.stats["accepted_by_round"], len(self.stats["proposed_by_position"])),
        )
        return Generation(out, self.stats)

    def round(self, tokens: list[int], frontier: int, out: list[int], remaining: int) -> int:
        """One round after `frontier`; appends to `tokens`/`out`; returns the next frontier."""
        drafts, draft_probs = [], []
        m = min(self.proposer.max_drafts, remaining) if self.proposer is not None else 0
        if m:
            start = time.perf_counter()
            drafts, draft_probs = self.proposer.propose(tokens, frontier, m, self.chooser)
            self.stats["draft_time_s"] += time.perf_counter() - start
            self.state.caches.record_peaks()  # provisional draft rows (DeepSeek steps) count towards the draft peak
        elif self.proposer is not None:
            self.stats["fallbacks"] += 1
        result, seconds = self.target_pass([frontier, *drafts])  # row i predicts the slot after input i
        start = time.perf_counter()
        accepted, following = select(drafts, draft_probs, result.logits, self.chooser)
        self.stats["verify_time_s"] += seconds + time.perf_counter() - start
        self.after_pass(result, 1 + accepted)  # the frontier's row and the accepted drafts' rows
        tokens += [frontier, *drafts[:accepted]]

        new = [*drafts[:accepted], following][:remaining]  # an accepted last-slot draft gets no bonus
        if self.eos in new:
            new = new[: new.index(self.eos) + 1]  # an accepted EOS ends the output (no bonus)
        out += new
        s = self.stats
        s["rounds"] += 1
        for j in range(m):
            s["proposed_by_position"][j] += 1
            s["accepted_by_position"][j] += int(j < accepted)
        s["emitted_by_round"].append(len(new)), s["proposed_by_round"].append(m), s["accepted_by_round"].append(accepted)
        s["stopped_by_round"].append(len(new) == remaining or new[-1] == self.eos)
        return following

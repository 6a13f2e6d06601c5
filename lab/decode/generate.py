"""`generate`: plain and speculative decoding of one sequence with KV caches.

Both run the carried-frontier schedule (docs/decoding.md). Prefill runs the prompt and picks
the first new token f (the frontier: emitted, not yet in the target cache). Each round
then proposes m drafts after f (m = 0 in plain decoding), runs one target pass over
[f, drafts], accepts a prefix of the drafts exactly (lab.decode_core.acceptance), emits the
accepted drafts plus the correction or bonus token, commits the target rows of f and the
accepted drafts, and carries the last emitted token as the next frontier. Plain decoding
is the m = 0 case, so both paths share every line that touches the target cache.

With `tree`, a round proposes a tree of ranked candidates (lab.decode_core.tree), the target
pass runs over every node with an ancestry mask, acceptance follows the longest verified
root path, and that path's rows are committed in every cache (siblings are dropped). A
chain of drafts is the tree of widths [1] * m, so one round serves all three modes.

Positions start at 0 at the first prompt token, as for a document in training.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from lab.decode.batch import generate_batch, is_batch
from lab.decode.follow import PAST_THE_END, Follow
from lab.decode.ngram import PromptLookup
from lab.decode.proposers import build_proposer
from lab.decode.request import Generation, check_request
from lab.errors import ConfigError, require
from lab.decode_core.acceptance import accept_tree
from lab.decode_core.ledger import RoundLedger
from lab.decode_core.sampling import TokenChooser
from lab.decode_core.target import CachedModel
from lab.decode_core.tree import tree_shape

# The clock of `Generation.stats`' times: wall time. A benchmark on a shared machine sets a CPU clock
# (experiments/benchmarks/common.py `cpu_clock`), so that other processes' load does not count.
CLOCK = time.perf_counter


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
    tree=None,
    draws=None,
    ngram: PromptLookup | dict | None = None,
    stop: Callable[[list[int]], bool] | None = None,
    confidence: float | None = None,
    follow: list[int] | None = None,
) -> Generation | list[Generation]:
    """Continue `prompt` ([P] token ids) by up to `max_new_tokens` tokens (docs/api.md).

    `tree` (with `speculative`): widths per draft position (`[4, 3, 2]`) or root-to-leaf
    paths of candidate ranks (`[[0, 0], [0, 1], [1]]`). `draws`: the source of every random
    choice (default: `generator`'s; see lab.decode_core.sampling.TorchDraws). A batch (a [B, P]
    tensor or a list of 1-D prompts of any lengths) returns one Generation per prompt
    (lab.decode.batched: chains, no trees). `ngram` (with `speculative`): prompt lookup drafts
    (lab.decode.ngram.PromptLookup or its fields as a dict), alone on a model without draft heads
    or with `with_heads=False`, else merged into the heads' chain or tree as one more branch.
    `stop(tokens so far) -> bool`: the request also ends after the round in which it says True (a stop
    sequence in the text); every token before that point is the one decoding without `stop` writes.
    `confidence` (with `speculative`): the heads' drafts whose own probability is below it are not verified
    (lab.decode.choose.ConfidenceGated); `ngram.method="suffix"` drafts from a suffix trie, `ngram.combine="choose"`
    picks one drafter per round (lab.decode.choose.ChoosePerRound).
    `follow` (greedy): a replay — the target's choices are held to this continuation (≥ max_new_tokens ids), so every
    decoder writes the same text and is measured on it; `stats["replay_disagreements"]` counts the near-ties that
    held it (lab.decode.follow).
    """
    if is_batch(prompt):
        require(tree is None and draws is None, "tree", "batched requests decode chains with torch's draws; give one prompt for a tree")
        require(ngram is None, "ngram", "batched requests draft with the heads only; give one prompt for prompt lookup")
        require(confidence is None, "confidence", "batched requests draft every head's slot; give one prompt to gate drafts by confidence")
        require(follow is None, "follow", "batched requests decode freely; give one prompt to replay a reference")
        return generate_batch(model, prompt, max_new_tokens, temperature=temperature, top_k=top_k, speculative=speculative,
                              draft_steps=draft_steps, eos=eos, generator=generator, stop=stop)
    check_request(model, prompt, max_new_tokens, temperature, top_k, draft_steps)
    shape = None if tree is None else tree_shape(tree)
    lookup = prompt_lookup(ngram, speculative, model)
    replay = None if follow is None else Follow(follow, max_new_tokens, temperature)
    model.eval()
    with torch.no_grad():
        decoder = Decoder(model, TokenChooser(temperature, top_k, generator, draws), speculative, draft_steps, eos, shape, lookup, confidence,
                          replay)
        return decoder.run(prompt.tolist(), max_new_tokens, stop)


def prompt_lookup(ngram, speculative: bool, model) -> PromptLookup | None:
    """The n-gram settings of a request, checked against the request and the model's context."""
    if ngram is None:
        return None
    require(speculative, "ngram", "proposes drafts that the model verifies: it needs speculative=True")
    if isinstance(ngram, dict):
        fields = [f.name for f in dataclasses.fields(PromptLookup)]
        unknown = set(ngram) - set(fields)
        require(not unknown, "ngram", f"has unknown fields {sorted(unknown)}; allowed: {', '.join(fields)}")
        ngram = PromptLookup(**ngram)
    require(isinstance(ngram, PromptLookup), "ngram", f"must be a PromptLookup or a dict of its fields, got {type(ngram).__name__}")
    ngram.check_context(model_context(model))
    return ngram


def model_context(model) -> int | None:
    """Positions the model was built for (a transformers config's max_position_embeddings); None when it declares none."""
    return model.trunk.context_length


class Decoder:
    def __init__(self, model, chooser: TokenChooser, speculative: bool, draft_steps: int | None, eos: int | None, tree=None,
                 ngram: PromptLookup | None = None, confidence: float | None = None, follow: Follow | None = None):
        self.state = CachedModel(model)
        self.chooser, self.eos, self.follow = chooser, eos, follow
        if speculative and not model.head_cfg.contiguous_offsets:
            raise ConfigError("speculative", f"head.offsets={list(model.head.offsets)} leave draft slots without a head; "
                              "speculative decoding needs contiguous offsets [1..K] (use speculative=False)")
        if tree is not None and not speculative:
            raise ConfigError("tree", "verifies draft candidates: it needs speculative=True")
        if tree is not None and tree.depth > model.k - 1:
            raise ConfigError("tree", f"has {tree.depth} draft positions but head '{model.head_cfg.name}' K={model.k} drafts {model.k - 1}; "
                              f"use at most {model.k - 1} widths")
        if tree is not None and max(tree.widths) > model.model_cfg.vocab_size:
            raise ConfigError("tree", f"asks for {max(tree.widths)} candidates at one position; the vocabulary has {model.model_cfg.vocab_size}")
        require(speculative or confidence is None, "confidence", "gates the drafts that the model verifies: it needs speculative=True")
        self.proposer = build_proposer(self.state, draft_steps, tree, ngram, confidence) if speculative else None
        if speculative and (self.proposer is None or self.proposer.max_drafts < 1):
            raise ConfigError(
                "speculative", f"head '{model.head_cfg.name}' with K={model.k} has no draft heads; use a K ≥ 2 head, prompt lookup (ngram) or speculative=False"
            )
        self.ledger = RoundLedger(self.proposer.max_drafts if self.proposer else 0)
        self.stats = {  # beside the ledger's counters: times, trees, lookup
            "prefill_time_s": 0.0, "draft_time_s": 0.0, "verify_time_s": 0.0,
            "tree_nodes": 0,  # draft nodes verified, all rounds
            "lookup_nodes": 0, "lookup_accepted": 0,  # of them proposed by prompt lookup (point masses), and accepted
            "accepted_beyond_top1": 0,  # rounds whose accepted path took a candidate of rank ≥ 1 (a tree's gain over the chain)
            "drafter_by_round": [],  # per round, who drafted: lookup, heads, both (a graft) or none (no draft)
            # where a round's time goes: the target forward, the draft blocks, and everything else
            # (projections of drafts, candidate choice, acceptance, cache commits, bookkeeping)
            "time_split_s": {"target_forward": 0.0, "draft_blocks": 0.0, "outside_blocks": 0.0},
        }

    def target_pass(self, tokens: list[int], shape=None, last_logits_only: bool = False):
        """One target forward; the next-token path's time is verification time."""
        start = CLOCK()
        result = self.state.forward(tokens, shape, last_logits_only)
        self.ledger.target_forwards += 1
        return result, CLOCK() - start

    def after_pass(self, result, rows: list[int]) -> None:
        start = CLOCK()
        if self.proposer is not None:
            self.proposer.after_verify(result, rows)  # the draft heads' share of the pass
        self.stats["draft_time_s"] += CLOCK() - start
        self.state.commit_rows(rows)

    def run(self, prompt: list[int], max_new_tokens: int, stop=None) -> Generation:
        begin = CLOCK()
        out: list[int] = []
        if max_new_tokens > 0:
            result, seconds = self.target_pass(prompt, last_logits_only=True)  # prefill
            frontier = self.target_choice(result.logits[-1], 0)
            self.stats["prefill_time_s"] += seconds
            self.after_pass(result, list(range(len(prompt))))
            out.append(frontier)
            tokens = list(prompt)  # tokens with committed target rows
            rounds_begin = CLOCK()
            while len(out) < max_new_tokens and out[-1] != self.eos and not (stop is not None and stop(out)):
                frontier = self.round(tokens, frontier, out, max_new_tokens - len(out))
            self.settle_split(CLOCK() - rounds_begin)
        elapsed = CLOCK() - begin
        self.stats.update(
            **self.ledger.stats(out),
            kv_bytes=dict(self.state.caches.peak_bytes),
            kv_bytes_by_cache={str(key): cache.length * cache.row_bytes() for key, cache in self.state.caches.caches.items()},  # held at the end
            total_time_s=elapsed,
            tokens_per_s=len(out) / elapsed if elapsed > 0 else float("nan"),
        )
        if self.follow is not None:
            self.stats["replay_disagreements"] = self.follow.disagreements
        return Generation(out, self.stats)

    def target_choice(self, logits: torch.Tensor, slot: int) -> int:
        """The target's token for output slot `slot` from its [V] logits (a replay: the reference's token there)."""
        if self.follow is None:
            return self.chooser.choose(logits)[0]
        token = self.follow.token(slot)
        self.held(logits[None], [token])
        return token

    def held(self, logits: torch.Tensor, chosen: list[int]) -> None:
        """A replay's emitted choices ([r, V] their rows) against the target's own argmax (slots past the reference skipped)."""
        kept = [i for i, token in enumerate(chosen) if token != PAST_THE_END]
        self.follow.count(logits[kept], [chosen[i] for i in kept])

    def settle_split(self, rounds_s: float) -> None:
        split = self.stats["time_split_s"]
        split["draft_blocks"] = getattr(self.proposer, "draft_blocks_s", 0.0)  # prefill's share included
        split["outside_blocks"] = max(0.0, rounds_s - split["target_forward"] - split["draft_blocks"])

    def round(self, tokens: list[int], frontier: int, out: list[int], remaining: int) -> int:
        """One round after `frontier`; appends to `tokens`/`out`; returns the next frontier."""
        m = min(self.proposer.max_drafts, remaining) if self.proposer is not None else 0
        if not m:
            self.ledger.fallbacks += self.proposer is not None
            return self.plain_step(tokens, frontier, out, remaining)
        start = CLOCK()
        buffer = self.proposer.propose(tokens, frontier, m, self.chooser)
        self.stats["draft_time_s"] += CLOCK() - start
        self.state.caches.record_peaks()  # provisional draft rows (DeepSeek steps) count towards the draft peak
        if buffer.prefix_version != self.state.length:
            raise RuntimeError(f"proposal made after {buffer.prefix_version} committed rows, target holds {self.state.length}")
        result, seconds = self.target_pass(buffer.tokens, buffer.shape)  # row i predicts the slot after node i
        self.stats["time_split_s"]["target_forward"] += seconds
        start = CLOCK()
        forced = None if self.follow is None else self.follow.forced(len(out), buffer.shape.depths)  # [n] a replay's choices
        path, following = accept_tree(buffer, result.logits, self.chooser, forced)
        accepted_tokens = buffer.path_tokens(path)
        if self.follow is not None:
            self.held(result.logits[[0, *path]], [*accepted_tokens, following])  # row of node i predicted the token after it
        self.stats["verify_time_s"] += seconds + CLOCK() - start
        self.after_pass(result, [0, *path])  # the frontier's row and the accepted path's rows
        self.stats["accepted_beyond_top1"] += any(buffer.shape.ranks[node] for node in path)
        self.stats["lookup_nodes"] += len(buffer.point_masses)
        self.stats["lookup_accepted"] += sum(node in buffer.point_masses for node in path)
        self.stats["drafter_by_round"].append(drafter_of(buffer))
        tokens += [frontier, *accepted_tokens]
        self.ledger.record_path(len(out) - 1, buffer.path_tokens(_rank0_path(buffer.shape)), len(path))
        # positions offered: the deepest proposal (prompt lookup may find fewer than m drafts, or none)
        return self.emit(out, accepted_tokens, following, remaining, buffer.shape.depth, buffer.shape.size - 1)

    def plain_step(self, tokens: list[int], frontier: int, out: list[int], remaining: int) -> int:
        """One target pass over the frontier, no drafts (plain decoding, or no slot left for a draft)."""
        result, seconds = self.target_pass([frontier])
        self.stats["time_split_s"]["target_forward"] += seconds
        start = CLOCK()
        following = self.target_choice(result.logits[0], len(out))
        self.stats["verify_time_s"] += seconds + CLOCK() - start
        self.after_pass(result, [0])
        tokens.append(frontier)
        self.stats["drafter_by_round"].append("none")
        return self.emit(out, [], following, remaining, 0, 0)

    def emit(self, out: list[int], accepted: list[int], following: int, remaining: int, m: int, nodes: int) -> int:
        """Publish the round's tokens (cut at the budget and at EOS) and count it; returns the next frontier."""
        new = [*accepted, following][:remaining]  # an accepted last-slot draft gets no bonus
        if self.eos in new:
            new = new[: new.index(self.eos) + 1]  # an accepted EOS ends the output (no bonus)
        out += new
        self.stats["tree_nodes"] += nodes
        self.ledger.count_round(m, len(accepted), len(new), len(new) == remaining or new[-1] == self.eos)
        return following


def drafter_of(buffer) -> str:
    """Who proposed a round's verified drafts: `lookup` (every node a point mass), `heads` (none), `both` (a graft that
    added lookup nodes; one whose chain followed the heads' nodes verified the heads' alone), `none` (a plain step)."""
    drafts, masses = buffer.shape.size - 1, len(buffer.point_masses)
    if not drafts:
        return "none"
    if masses == drafts:
        return "lookup"
    return "both" if masses else "heads"


def _rank0_path(shape) -> list[int]:
    """Node ids of the all-rank-0 path from the root's child down (the top-1 chain of the tree)."""
    path, node = [], 0
    while shape.children[node]:
        node = shape.children[node][0]
        path.append(node)
    return path

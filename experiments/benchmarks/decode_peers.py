"""Harness decoding against what a user would pick instead, on one transformers model (decode_speed --peers MODEL_DIR).

Same weights (the harness's trunk *is* the transformers model), same prompts, greedy, batch 1:
harness plain, prompt lookup alone, heads (chain), heads (tree), heads + prompt lookup; against
transformers' `generate` plain, with `prompt_lookup_num_tokens`, and with `use_mtp=True` where the
family declares MTP layers. Modes run interleaved per prompt (rotated order), each timed in
CPU time (`common.cpu_clock`: this thread's with one intra-op thread, the process's with more; the machine is shared);
per prompt the ratio to harness plain and to transformers plain, then the median and [min–max]
over prompts and repeats. Target forwards are counted with a forward hook on the base model
(every mode, transformers' included), so tokens per forward is measured the same way for all.

Prompts: "code" = the first lines of this repository's own decoding sources (text the model never
saw), "text" = short English paragraphs written for this benchmark. Heads: `--heads identity:3`
(default) puts untrained heads on the loaded model: identity heads have no parameters (every draft
slot reads the next-token logits), medusa's residual blocks start at zero (the same drafts). Heads
whose next-token path has its own block (parallel, causal, anticausal) change the model: the last
column ("same tokens") shows it.
"""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path

import torch

from experiments.benchmarks.common import cpu_clock, table
from lab.decode import generate
from lab.decode.follow import TransformersFollow
from lab.decode.ngram import PromptLookup

LOOKUP_TOKENS, LOOKUP_NGRAM = 10, 2  # transformers' prompt lookup settings; the harness's lookup uses the same
CHOOSE_MIN_MATCH = 2  # one drafter per round: the lookup on a match of ≥ 2 tokens (a 1-token match pays for ~4 drafts only)
GATE = 0.3  # the heads' drafts below this probability under the head are not verified
DRAFTS_PER_MATCHED_TOKEN = 3.0  # spec_factor: a 1-token match drafts 3 (P(≥ j accepted) falls fast after a weak match), a 2-token one 6
TEXT_PROMPTS = [
    "The river that runs past the old mill is slow in summer and loud in spring. Children from the village come down to it "
    "after school, and the miller, who has seen them do this for thirty years, still tells them to keep away from the wheel.",
    "To make a simple loaf of bread, mix flour, water, salt and a little yeast, then knead the dough until it is smooth. "
    "Leave it somewhere warm for an hour, shape it, let it rise again, and bake it in a hot oven until the crust is brown.",
    "Most people who learn a second language as adults find listening harder than reading. Written words stay on the page; "
    "spoken words arrive quickly, run together, and are gone before the listener has decided where one ends and the next begins.",
    "The committee met on Tuesday to discuss the budget for next year. After a long debate about the library, the members agreed "
    "to keep its opening hours, to delay the new roof until autumn, and to ask the council for a second opinion on the costs.",
]
PEER_SETS = ("code", "text", "humaneval")  # prompt_token_ids' sets
CODE_FILES = ["lab/decode/ngram.py", "lab/decode_core/tree.py", "lab/decode_core/acceptance.py", "lab/decode_core/cache.py"]


def code_prompts(root: Path, lines: int = 40) -> list[str]:
    """The first `lines` lines after each file's docstring: real code, unseen by any pretrained model."""
    out = []
    for name in CODE_FILES:
        text = (root / name).read_text().split('"""', 2)[-1]
        out.append("\n".join(text.strip().splitlines()[:lines]) + "\n")
    return out


class ForwardCounter:
    def __init__(self, module: torch.nn.Module):
        self.calls = 0
        module.register_forward_hook(lambda *args: setattr(self, "calls", self.calls + 1))


def harness(model, **options):
    """A harness decoder: (prompt, n, reference or None) -> (tokens, slots a replay held off the argmax or None)."""
    def decode(p, n, reference=None):
        out = generate(model, p, n, follow=reference, **options)
        return out.tokens, out.stats.get("replay_disagreements")
    return decode


def harness_modes(model, tree) -> dict:
    """Plain decoding runs the next-token path only, so one model with heads serves every harness mode."""
    sizes = tuple(range(LOOKUP_NGRAM, 0, -1))
    lookup = dict(max_draft=LOOKUP_TOKENS, with_heads=False)
    modes = {
        "harness plain": harness(model),
        "harness n-gram": harness(model, speculative=True, ngram=PromptLookup(sizes, **lookup)),
        "harness n-gram earliest, loop": harness(model, speculative=True, ngram=PromptLookup(sizes, occurrence="earliest", loop=True, **lookup)),
        "harness suffix": harness(model, speculative=True, ngram=PromptLookup(method="suffix", loop=True, **lookup)),
        "harness n-gram, both occurrences": harness(model, speculative=True, ngram=PromptLookup(sizes, occurrence="both", **lookup)),
        f"harness n-gram, ≤ {DRAFTS_PER_MATCHED_TOKEN} drafts per matched token": harness(
            model, speculative=True, ngram=PromptLookup(sizes, spec_factor=DRAFTS_PER_MATCHED_TOKEN, **lookup)),
    }
    if model.k > 1:
        choose = dict(max_draft=LOOKUP_TOKENS, combine="choose", min_match=CHOOSE_MIN_MATCH, loop=True)
        modes["harness heads chain"] = harness(model, speculative=True)
        modes[f"harness heads chain, p ≥ {GATE}"] = harness(model, speculative=True, confidence=GATE)
        if model.head.drafter is not None and model.head.drafter.drafts_trees and tree:
            modes[f"harness heads tree {tree}"] = harness(model, speculative=True, tree=tree)
        modes["harness heads + n-gram"] = harness(model, speculative=True, ngram=PromptLookup(sizes, LOOKUP_TOKENS))
        modes["harness suffix or heads"] = harness(model, speculative=True, confidence=GATE, ngram=PromptLookup(method="suffix", **choose))
        modes["harness n-gram or heads"] = harness(model, speculative=True, confidence=GATE, ngram=PromptLookup(sizes, **choose))
    return modes


def transformers_modes(hf) -> dict:
    def run(**options):
        def decode(p, n, reference=None):
            ids = p[None]
            held = TransformersFollow(hf, reference, p.numel()) if reference is not None else contextlib.nullcontext()
            with held:
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                  eos_token_id=None, pad_token_id=0, **options)
            return out[0, p.numel():].tolist(), None if reference is None else held.disagreements
        return decode

    modes = {"transformers plain": run(), "transformers prompt lookup": run(prompt_lookup_num_tokens=LOOKUP_TOKENS,
                                                                             max_matching_ngram_size=LOOKUP_NGRAM)}
    if getattr(hf.config, "num_nextn_predict_layers", 0):
        modes["transformers use_mtp"] = run(use_mtp=True)
    return modes


def peers_report(model, prompt_ids: dict[str, list[list[int]]], new_tokens: int, repeats: int, tree, label: str,
                 replay: bool = False) -> list[list]:
    """prompt_ids: {"code": [...], "text": [...], "humaneval": [...]} token ids. Rows of `HEADERS`.

    `replay`: every decoder, transformers' included, is held to harness plain's continuation of each prompt
    (lab.decode.follow), so all write the same text in any dtype; the last column counts the slots held off the argmax."""
    modes = {**harness_modes(model, tree), **transformers_modes(model.hf_model)}
    counter = ForwardCounter(model.hf_model.base_model)
    clock = cpu_clock()
    rows = []
    for kind, ids in prompt_ids.items():
        prompts = [torch.tensor(p) for p in ids]
        seconds, forwards = {name: [] for name in modes}, {name: 0 for name in modes}
        references = [modes["harness plain"](p, new_tokens)[0] for p in prompts]
        held = references if replay else [None] * len(prompts)
        same = {name: agreement([modes[name](p, new_tokens, r) for p, r in zip(prompts, held)], references) for name in modes}  # also warms up
        for repeat in range(repeats):
            for i, (prompt, reference) in enumerate(zip(prompts, held)):
                shift = (repeat + i) % len(modes)
                names = list(modes)
                for name in names[shift:] + names[:shift]:
                    before, start = counter.calls, clock()
                    modes[name](prompt, new_tokens, reference)
                    seconds[name].append(clock() - start)
                    forwards[name] += counter.calls - before
        rows += summarize(kind, label, seconds, forwards, same, new_tokens, len(prompts) * repeats)
    return rows


def agreement(decoded: list[tuple[list[int], int | None]], references: list[list[int]]) -> str:
    """`n/N` prompts whose output is the reference's, and where the first that is not parts from it; for a replay,
    the slots held off the target's own argmax (near-ties: the decoder alone would have written another token there)."""
    outputs = [tokens for tokens, _ in decoded]
    same = sum(o == r for o, r in zip(outputs, references))
    parted = [next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), min(len(o), len(r))) for o, r in zip(outputs, references) if o != r]
    held = [count for _, count in decoded if count is not None]
    return (f"{same}/{len(references)}" + (f" (first parts at token {min(parted)})" if parted else "")
            + (f"; replay held {sum(held)} of {sum(map(len, outputs))} slots" if held else ""))


def prompt_token_ids(tokenizer, root: Path, humaneval: int = 8) -> dict[str, list[list[int]]]:
    """The three prompt sets: held-out stdlib code, natural text, and the first `humaneval` HumanEval prompts."""
    from lab.eval.humaneval import load_problems

    return {"code": [tokenizer(t)["input_ids"] for t in code_prompts(root)], "text": [tokenizer(t)["input_ids"] for t in TEXT_PROMPTS],
            "humaneval": [tokenizer(p.prompt)["input_ids"] for p in load_problems(humaneval)]}


def summarize(kind: str, label: str, seconds: dict, forwards: dict, same: dict, new_tokens: int, runs: int) -> list[list]:
    rows = []
    for name, samples in seconds.items():
        to_plain = [s / p for s, p in zip(samples, seconds["harness plain"])]  # per run: time ratio (> 1 = slower)
        to_hf = [s / p for s, p in zip(samples, seconds["transformers plain"])]
        to_lookup = [s / p for s, p in zip(samples, seconds["transformers prompt lookup"])]
        speed = lambda ratios: f"{1 / statistics.median(ratios):.2f} [{1 / max(ratios):.2f}–{1 / min(ratios):.2f}]"  # noqa: E731
        rows.append([label, kind, name, f"{new_tokens * runs / forwards[name]:.2f}" if forwards[name] else "—",
                     f"{statistics.median(samples) / new_tokens * 1e3:.1f}", speed(to_plain), speed(to_hf), speed(to_lookup), same[name]])
    return rows


HEADERS = ["model", "prompts", "decoder", "tokens/forward", "CPU ms/token", "speed vs harness plain", "speed vs transformers plain",
           "speed vs transformers prompt lookup", "same tokens as harness plain"]


def print_peers(rows: list[list], new_tokens: int, repeats: int, replay: bool = False) -> None:
    held = ", every decoder replaying harness plain's text (identical text)" if replay else ""
    print(f"\n== peers: greedy{held}, batch 1, {new_tokens} new tokens, {repeats} interleaved repeats per prompt, per-thread CPU time, "
          f"{torch.get_num_threads()} thread(s); speed = median [min–max] of per-run time ratios")
    print(table(HEADERS, rows))

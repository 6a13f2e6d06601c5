"""`lab-generate CKPT_OR_RUN_DIR_OR_RELEASE --prompt TEXT`: continue a prompt with a trained model.

The continuation goes to stdout; the summary goes to stderr, so `> file` keeps only text: tokens,
tokens/s on the wall clock and the worker thread's CPU clock (flagged when another process held the
cores), target forwards; with --speculative the runtime ledger and the speed against plain decoding
of the same prompt, measured as `decode_speed` measures it (paired runs, lab/decode/compare.py). On an
MoE model --speculative adds a line, the experts each round touched (lab/decode_core/moe_ledger.py).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

from lab.decode.compare import compare_with_plain, plain_options, speed_line
from lab.decode.generate import generate
from lab.decode.loading import load_for_generation
from lab.decode.ngram import DEFAULT_MAX_DRAFT, PromptLookup
from lab.errors import ConfigError, require
from lab.decode_core.ledger import ledger_line
from lab.decode_core.moe_ledger import MoELedger
from lab.decode_core.moe_ledger import ledger_line as moe_ledger_line
from lab.tracking.timing import timed


def read_prompt(args) -> str:
    if args.prompt is not None:
        text = args.prompt
        try:
            text.encode("utf-8")  # undecodable argv bytes arrive as lone surrogates
        except UnicodeEncodeError:
            raise ConfigError("--prompt", "contains bytes that are not UTF-8; the tokenizer encodes UTF-8 text only") from None
        return text
    if args.prompt_file is not None:
        try:
            raw = open(args.prompt_file, "rb").read()
        except OSError as error:
            raise ConfigError("--prompt-file", f"cannot read {args.prompt_file}: {error.strerror}") from None
        field = "--prompt-file"
    else:
        raw = sys.stdin.buffer.read()
        field = "stdin"
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(field, f"byte {error.start} is not UTF-8; the tokenizer encodes UTF-8 text only") from None


def parse_tree(text: str | None, speculative: bool) -> list[int] | None:
    """`--tree 4,3,2`: candidate widths per draft position."""
    if text is None:
        return None
    if not speculative:
        raise ConfigError("--tree", "verifies draft candidates: add --speculative")
    try:
        return [int(w) for w in text.split(",")]
    except ValueError:
        raise ConfigError("--tree", f"must be comma-separated widths per draft position (e.g. 4,3,2), got {text!r}") from None


def parse_ngram(args) -> PromptLookup | None:
    """`--ngram 3,2,1 [--ngram-draft 10] [--ngram-only]`, or `--suffix`: lookup drafts (n-gram lengths tried longest first,
    or the suffix trie); `--choose N` one drafter per round (the lookup on a match of ≥ N tokens, else the heads);
    `--loop`, `--spec-factor F`: drafts past the text's end along its repeat, at most ceil(F × match) of them."""
    lookup_flags = {"--ngram-draft": args.ngram_draft is not None, "--ngram-only": args.ngram_only, "--choose": args.choose is not None,
                    "--loop": args.loop, "--spec-factor": args.spec_factor is not None}
    if args.ngram is None and not args.suffix:
        given = next((flag for flag, on in lookup_flags.items() if on), None)
        if given is not None:
            raise ConfigError(given, "sets up lookup drafts: add --ngram SIZES (e.g. 3,2,1) or --suffix")
        return None
    if not args.speculative:
        raise ConfigError("--suffix" if args.suffix else "--ngram", "proposes drafts that the model verifies: add --speculative")
    if args.suffix and args.ngram is not None:
        raise ConfigError("--ngram", "sets n-gram lengths, and --suffix drafts from the suffix trie (it has no lengths to set): give one of them")
    sizes = parse_sizes(args.ngram) if args.ngram is not None else list(PromptLookup.sizes)
    draft = DEFAULT_MAX_DRAFT if args.ngram_draft is None else args.ngram_draft
    if draft < 1:
        raise ConfigError("--ngram-draft", f"must be ≥ 1 (draft tokens per round), got {draft}")
    if args.choose is not None and args.choose < 1:
        raise ConfigError("--choose", f"must be ≥ 1 (tokens of match before the lookup drafts instead of the heads), got {args.choose}")
    if args.spec_factor is not None and not args.spec_factor > 0:
        raise ConfigError("--spec-factor", f"must be > 0 (drafts per matched token), got {args.spec_factor}")
    return PromptLookup(tuple(sizes), draft, with_heads=not args.ngram_only, method="suffix" if args.suffix else "ngram",
                        combine="graft" if args.choose is None else "choose", min_match=args.choose or PromptLookup.min_match,
                        loop=args.loop, spec_factor=args.spec_factor)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(n) for n in text.split(",")]
    except ValueError:
        raise ConfigError("--ngram", f"must be comma-separated n-gram lengths ≥ 1 (e.g. 3,2,1), got {text!r}") from None
    if any(n < 1 for n in sizes):
        raise ConfigError("--ngram", f"n-gram lengths must be ≥ 1, got {text!r}")
    return sizes


def check_ngram_context(ngram: PromptLookup | None, context: int | None) -> None:
    if ngram is not None and context is not None and ngram.max_draft >= context - 1:
        raise ConfigError("--ngram-draft", f"must be < {context - 1}: {ngram.max_draft} drafts per round do not fit the trained context "
                          f"data.seq_len={context}")


def check_context(prompt_tokens: int, new_tokens: int, context: int | None, refuse: bool) -> None:
    """Generating past the trained length uses rotary positions training never saw: a warning line, or (--max-context) a refusal."""
    total = prompt_tokens + new_tokens
    if context is None or total <= context:
        return
    what = f"prompt ({prompt_tokens} tokens) + --max-new-tokens {new_tokens} = {total} positions, past the trained context data.seq_len={context}"
    if refuse:
        raise ConfigError("--max-new-tokens", f"{what}; with --max-context at most {max(0, context - prompt_tokens)} new tokens")
    print(f"warning: {what} (positions never seen in training; --max-context refuses instead)", file=sys.stderr)


def run(args) -> None:
    if args.temperature < 0:
        raise ConfigError("--temperature", f"must be ≥ 0 (0 = greedy), got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ConfigError("--top-k", f"must be ≥ 1, got {args.top_k}")
    if args.max_new_tokens < 0:
        raise ConfigError("--max-new-tokens", f"must be ≥ 0, got {args.max_new_tokens}")
    if args.pairs < 0:
        raise ConfigError("--pairs", f"must be ≥ 0 (0: no comparison with plain decoding), got {args.pairs}")
    tree = parse_tree(args.tree, args.speculative)
    require(args.draft_vocab is None or args.speculative, "--draft-vocab", "restricts what the heads draft: add --speculative")
    ngram = parse_ngram(args)
    if args.confidence is not None:
        require(args.speculative, "--confidence", "gates the drafts the model verifies: add --speculative")
        require(0 < args.confidence < 1, "--confidence", f"must be a probability in (0, 1) (a draft below it is not verified), got {args.confidence}")
    text = read_prompt(args)
    loaded = load_for_generation(args.model)
    check_ngram_context(ngram, loaded.context)
    if args.draft_vocab is not None:
        from lab.decode.draft_vocab_source import apply_draft_vocab

        apply_draft_vocab(loaded.model, args.model, args.draft_vocab)
    if args.speculative and loaded.proposer_refusal and ngram is None:  # prompt lookup needs no heads
        raise ConfigError("--speculative", loaded.proposer_refusal)
    ids = loaded.tokenizer.encode(text)
    if not ids:
        raise ConfigError("prompt", "is empty; give at least one character")
    if loaded.context is not None and len(ids) > loaded.context:
        raise ConfigError("prompt", f"has {len(ids)} tokens, longer than the model's context of {loaded.context} (data.seq_len)")
    check_context(len(ids), args.max_new_tokens, loaded.context, refuse=args.max_context)
    moe = MoELedger(loaded.model) if args.speculative else None  # an MoE model's experts per round (no hooks on a dense one)
    options = dict(temperature=args.temperature, top_k=args.top_k, draft_steps=args.draft_steps, eos=loaded.tokenizer.eos_id,
                   tree=tree, ngram=ngram, confidence=args.confidence)
    prompt = torch.tensor(ids)
    with moe if moe is not None and moe.places else contextlib.nullcontext():
        if args.speculative and args.pairs > 0:
            out, comparison = compare_with_plain(loaded.model, prompt, args.max_new_tokens, options, args.seed, args.pairs)
            span = comparison.spans[-1]
        else:
            generator = torch.Generator().manual_seed(args.seed)
            out, span = timed(lambda: generate(loaded.model, prompt, args.max_new_tokens, speculative=args.speculative,
                                               generator=generator, **(options if args.speculative else plain_options(options))))
            comparison = None
    sys.stdout.write(loaded.tokenizer.decode(out.tokens) + "\n")
    sys.stdout.flush()
    s = out.stats
    print(f"tokens: {s['emitted']}  {speed_line(span, s['emitted'])}  target forwards: {s['target_forwards']}", file=sys.stderr)
    if args.speculative:
        print(ledger_line(s), file=sys.stderr)
    if comparison is not None:
        print(comparison.line(), file=sys.stderr)
    if moe is not None and moe.places:
        print(moe_ledger_line(moe.report(s)), file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="lab-generate", description="Continue a prompt with a lab-train checkpoint, run dir or lab-export release.")
    parser.add_argument("model", help="checkpoint file, run directory (uses checkpoints/last.ckpt) or release folder")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--prompt", help="prompt text (default: read stdin)")
    source.add_argument("--prompt-file", help="read the prompt from this UTF-8 file")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speculative", action="store_true",
                        help="draft with the MTP heads, verify with the model: exact (greedy: the plain tokens in float32; in bf16 a "
                             "near-tie of the top two logits may part them); also decodes plainly to measure the speedup (--pairs)")
    parser.add_argument("--pairs", type=int, default=3,
                        help="with --speculative: plain and speculative runs back to back, this many times; the speedup is their "
                             "median, from CPU time when contended (0: no comparison)")
    parser.add_argument("--draft-steps", type=int, default=None, help="drafts per round (default: K-1 heads, or D DeepSeek depths)")
    parser.add_argument("--tree", default=None, help="with --speculative: verify a tree of candidates, widths per draft position (e.g. 4,3,2)")
    parser.add_argument("--ngram", default=None, help="with --speculative: prompt lookup drafts, n-gram lengths tried longest first (e.g. 3,2,1)")
    parser.add_argument("--ngram-draft", type=int, default=None, help=f"prompt lookup: draft tokens per round at most (default {DEFAULT_MAX_DRAFT})")
    parser.add_argument("--ngram-only", action="store_true", help="prompt lookup alone, without the model's draft heads")
    parser.add_argument("--suffix", action="store_true", help="with --speculative: lookup drafts from a suffix trie of the text "
                        "(the most frequent continuation of the longest match) instead of n-grams")
    parser.add_argument("--choose", type=int, default=None, metavar="N", help="lookup and heads: one drafter per round, the lookup "
                        "when its match is ≥ N tokens, else the heads (default: both every round)")
    parser.add_argument("--loop", action="store_true", help="lookup drafts that reach the end of the text go on along its repeat")
    parser.add_argument("--spec-factor", type=float, default=None, help="lookup: at most ceil(F × match length) drafts per round")
    parser.add_argument("--confidence", type=float, default=None, metavar="P", help="with --speculative: the heads' drafts whose "
                        "probability under the head is below P are not verified")
    parser.add_argument("--draft-vocab", type=int, default=None,
                        help="with --speculative: draft over the N most frequent tokens of the run's training data (verification keeps every id)")
    parser.add_argument("--max-context", action="store_true", help="refuse (instead of warning) when prompt + new tokens exceed the trained data.seq_len")
    args = parser.parse_args(argv)
    try:
        run(args)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

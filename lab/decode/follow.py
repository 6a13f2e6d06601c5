"""Replay: greedy decoding held to a fixed continuation, so that every decoder writes the same text.

Tokens per forward and speed compare decoders fairly only on identical text. In bf16 the target's
argmax at a near-tie depends on how many rows a pass verifies, so each decoder writes (and is then
measured on) its own continuation, and a looping one looks fast. With `generate(..., follow=reference)`
the *target's* greedy choice at output position i is `reference[i]`; the drafters are untouched (they
still propose from their own heads, lookup tables and logits). A round therefore accepts exactly the
drafts that verification along that text accepts, every forward and draft is real and timed, and the
output is `reference[:max_new_tokens]` for every decoder.

`disagreements` counts the emitted positions where the target's own argmax was another token: 0 for
the decoder that wrote the reference (up to run-to-run noise), the near-ties of the others. A replay
with many disagreements is far from what that decoder writes by itself; the count is reported beside it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lab.errors import require

PAST_THE_END = -1  # the forced choice of a slot beyond the reference: matches no draft


class Follow:
    """The reference continuation a greedy request is held to, and the near-ties that held it."""

    def __init__(self, reference: Sequence[int], max_new_tokens: int, temperature: float):
        require(temperature == 0, "follow", f"holds greedy decoding to a reference continuation; it needs temperature=0, got {temperature}")
        require(len(reference) >= max_new_tokens, "follow",
                f"the reference has {len(reference)} tokens; it must cover max_new_tokens={max_new_tokens}")
        self.reference = [int(t) for t in reference]
        self.disagreements = 0  # emitted positions where the target's argmax was not the reference's token

    def token(self, position: int) -> int:
        """The target's forced choice for output slot `position` (0 = the first new token)."""
        return self.reference[position] if position < len(self.reference) else PAST_THE_END

    def forced(self, emitted: int, depths: Sequence[int]) -> list[int]:
        """Per node of a round's pass: the choice for the slot after it. `emitted` = len(out), frontier included,
        so the frontier's row (depth 0) predicts slot `emitted` and a node at depth d slot `emitted + d`."""
        return [self.token(emitted + depth) for depth in depths]

    def count(self, logits: torch.Tensor, chosen: Sequence[int]) -> None:
        """logits: [r, V] the rows whose forced choices `chosen` were emitted; counts those the argmax would not have made."""
        own = logits.argmax(dim=-1).tolist()  # [r]
        self.disagreements += sum(a != b for a, b in zip(own, chosen))


class TransformersFollow:
    """The same replay for transformers' `generate` (plain, prompt lookup, assisted), as a context manager:
    `with TransformersFollow(hf_model, reference, prompt_length): hf_model.generate(..., do_sample=False)`.

    A forward hook on the model holds each logits row to the reference's token at the slot it predicts, so greedy
    selection and assisted verification both choose it, and a round accepts the candidates that equal the reference.
    Not a logits processor: transformers' prompt lookup passes the processors to its candidate generator, which
    drops every candidate token a processor forbids, so a processor holding the reference would let it verify only
    the drafts that will be accepted (fewer rows, more matches tried), which is not what prompt lookup does alone.
    A slot is predicted again after a rejection; the last row is the one that emitted it, so `disagreements`
    keeps the last verdict per slot.
    """

    def __init__(self, model, reference: Sequence[int], prompt_length: int):
        self.model, self.reference, self.prompt_length = model, [int(t) for t in reference], prompt_length
        self.agrees: dict[int, bool] = {}  # per output slot: the model's own argmax was the reference's token

    def __enter__(self) -> TransformersFollow:
        self.handle = self.model.register_forward_hook(self._hold, with_kwargs=True)
        return self

    def __exit__(self, *exc) -> None:
        self.handle.remove()

    def _hold(self, module, args, kwargs, output):
        logits = output.logits  # [1, r, V]: the last r input rows
        cache = next(value for value in kwargs.values() if hasattr(value, "get_seq_length"))
        end = cache.get_seq_length()  # rows the cache holds after this forward: the last logits row sits at end − 1
        own = logits[0].argmax(dim=-1).tolist()  # [r]
        first = end - len(own) + 1 - self.prompt_length  # slot of row 0: the row at position p predicts slot p + 1 − P
        rows = [row for row in range(len(own)) if 0 <= first + row < len(self.reference)]
        tokens = [self.reference[first + row] for row in rows]
        self.agrees.update({first + row: own[row] == token for row, token in zip(rows, tokens)})
        logits[0, rows] = float("-inf")  # [h, V]: the held rows
        logits[0, rows, tokens] = 0.0  # [h]: each at its reference token
        return output

    @property
    def disagreements(self) -> int:
        return sum(not agreed for agreed in self.agrees.values())

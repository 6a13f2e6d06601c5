"""The teacherless objective (Bachmann & Nagarajan 2024): answers predicted from the prompt alone.

`objective.teacherless=true` gives every synthetic batch a second token view, `input_tokens`
([B, S]): the tokens with each answer token replaced by one fixed dummy id. The model embeds
`input_tokens` (trunk and DeepSeek chain, lab/model/mtp.py) while every label still comes from
`tokens` (lab/labels.py, unchanged), so answer token j is predicted at row P + j − 1 from the
prompt and j − 1 dummies: no earlier answer token can be copied forward, which removes the
Clever-Hans shortcut. Masks, heads, reductions and λ schedules are untouched, so it composes
with all of them.

The dummy is the tokenizer's PAD id: no active row reads it otherwise (padding rows are inactive),
so its embedding is free to mean "an answer token not shown". The EOS after the answer keeps its id.
"""

from __future__ import annotations


def teacherless_ids(prompt_ids: list[int], answer_len: int, eos_id: int, dummy_id: int) -> list[int]:
    """The input view of one document `prompt answer EOS`: `prompt dummy × answer_len EOS`."""
    return [*prompt_ids, *[dummy_id] * answer_len, eos_id]

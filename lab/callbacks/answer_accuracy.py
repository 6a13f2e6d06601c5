"""Answer accuracy of a synthetic task (data=star_graph|induction), after every validation pass.

The datamodule's `answer_examples()` gives (prompt ids, answer ids) of a bounded number of
validation examples (`data.answer_examples`, 64 by default); each prompt is decoded greedily
with `lab.decode.generate` for as many tokens as its answer has, and scored (see
`lab.decode.answers`, which defines each):

    val/answer_exact (+ _se)                 greedy answer == true answer (per example)
    val/answer_token_acc                     greedy token == true token (per answer position)
    val/answer_tf_acc                        teacher-forced next-token accuracy on the same answer tokens
    val/answer_first_acc (+ _se)             the answer right through its decision token
    val/answer_exact_given_first (+ _se)     exact among answers whose decision is right
    val/answer_examples                      n, the examples scored
    val/answer_first_chance                  the decision's chance level (1/degree on star graphs)

A teacherless run (`objective.teacherless=true`) is decoded the teacherless way: the prompt
then dummy tokens, in one forward.

A text corpus has no answers: the callback does nothing there. Every DDP rank scores the
same examples with the same weights, so the values agree without a reduction.
"""

from __future__ import annotations

import pytorch_lightning as pl

from lab.decode.answers import answer_accuracy


class AnswerAccuracy(pl.Callback):
    def on_validation_epoch_end(self, trainer, pl_module):
        examples_of = getattr(trainer.datamodule, "answer_examples", None) if trainer.datamodule is not None else None
        if trainer.sanity_checking or examples_of is None:
            return
        examples = examples_of()
        if not examples:
            return
        module = trainer.datamodule
        scores = answer_accuracy(pl_module.model, examples, module.decision_index, module.teacherless_dummy_id)
        scores["answer_first_chance"] = module.decision_chance
        metrics = {f"val/{name}": value for name, value in scores.items()}
        pl_module.log_dict(metrics, on_epoch=True, sync_dist=False, batch_size=1)

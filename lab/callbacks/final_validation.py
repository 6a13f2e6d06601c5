"""Every run ends with a validation pass, whatever `trainer.val_check_interval` says.

With `trainer.max_steps=6` and the default interval of 200, Lightning would never validate:
run.json, the report table and the paper figures would have no validation metric at all.
Asking the loop to stop after the last step makes Lightning validate then (its fit loop runs
validation when a stop is requested); when the last step is also an interval step, that is
the same single validation pass.
"""

from __future__ import annotations

import pytorch_lightning as pl


class ValidateAtEnd(pl.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True

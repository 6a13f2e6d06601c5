"""Keeps run.json's running attempt current (step, time), so a killed attempt's progress and run time are known."""

import pytorch_lightning as pl


class RunHeartbeat(pl.Callback):
    def __init__(self, record):
        self.record = record  # lab.run.record.RunRecord of this attempt

    def on_train_start(self, trainer, pl_module):
        self.record.heartbeat(trainer.global_step, force=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.record.heartbeat(trainer.global_step)

"""When a training step's metrics reach the loggers, so nothing is built on steps that log nothing."""

from __future__ import annotations


def logs_this_step(trainer) -> bool:
    """True on the steps whose `on_step` metrics Lightning sends to the loggers (every
    `trainer.log_every_n_steps` batches, or when stopping), and on the run's last step (its
    values are the final metrics run.json records). Valid in training_step and in batch hooks.
    """
    if trainer is None:
        return True
    stepped = trainer.fit_loop.epoch_loop._batches_that_stepped  # batches stepped before this one (Lightning's own count)
    last = trainer.max_steps is not None and trainer.max_steps > 0 and stepped + 1 >= trainer.max_steps
    return last or trainer._logger_connector.should_update_logs

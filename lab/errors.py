"""One error type for bad input, so the CLI can print a single line and exit non-zero; one for a run stopped by a signal."""

import signal


class ConfigError(ValueError):
    """Bad config, data or checkpoint. `field` names the offending setting."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ConfigError(field, message)


class RunInterrupted(Exception):
    """Training stopped by `signum` after `step` optimizer steps."""

    def __init__(self, signum: int, step: int):
        self.signum, self.step = int(signum), int(step)
        super().__init__(f"stopped by {signal.Signals(self.signum).name} at step {self.step}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

"""One error type for bad input, so the CLI can print a single line and exit non-zero."""


class ConfigError(ValueError):
    """Bad config, data or checkpoint. `field` names the offending setting."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise ConfigError(field, message)

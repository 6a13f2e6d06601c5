"""`WANDB_MODE=online` without a way to the wandb server: refused in one line before training starts.

wandb itself retries its first connection for minutes and then ends the run with a long
traceback, after the run folder was made and nothing trained. A TCP connection to the server
(`WANDB_BASE_URL`, wandb's own setting, or its default) is tried here first, bounded by
`PROBE_TIMEOUT_S`. Behind an HTTP(S) proxy wandb does not connect directly, so the probe then
tries the proxy instead.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

from omegaconf import DictConfig, OmegaConf

from lab.errors import ConfigError

DEFAULT_BASE_URL = "https://api.wandb.ai"
PROBE_TIMEOUT_S = 10.0
ONLINE_MODES = ("online", "run")  # wandb's names for a run that talks to the server while it trains


def endpoint(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def server_to_probe() -> str:
    server = os.environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL
    proxy = os.environ.get("HTTPS_PROXY" if server.startswith("https") else "HTTP_PROXY") or os.environ.get("https_proxy") or os.environ.get("http_proxy")
    return proxy or server


def check_wandb_reachable(cfg: DictConfig) -> None:
    """With a wandb logger in online mode, the server (or proxy) accepts a connection within PROBE_TIMEOUT_S."""
    mode = OmegaConf.select(cfg, "logger.wandb.mode")
    if OmegaConf.select(cfg, "logger.wandb") is None or str(mode) not in ONLINE_MODES:
        return
    url = server_to_probe()
    try:
        socket.create_connection(endpoint(url), timeout=PROBE_TIMEOUT_S).close()
    except OSError as error:
        reason = "no answer" if isinstance(error, TimeoutError) else (os.strerror(error.errno).lower() if error.errno else str(error))
        raise ConfigError("logger.wandb.mode", f"online, but {url} cannot be reached ({reason}); run with WANDB_MODE=offline "
                                               "(and `wandb sync` the run later) or fix the network") from None

"""`WANDB_MODE=online` without a working wandb server: refused in one line before training starts.

wandb itself retries its first connection for minutes and then ends the run with a long
traceback, after the run folder was made and nothing trained. The probe here asks the server
(`WANDB_BASE_URL`, wandb's own setting, or its default) what the wandb client asks first — a
GraphQL POST to `/graphql` — and accepts any JSON answer (a wandb server answers an
unauthenticated query with JSON, 200 or 401). No connection, no name resolution, or an answer that
is not JSON (an intercepting proxy's 404 page, another web server) is the same one-line refusal.
The whole probe — name resolution included, which no socket timeout bounds — is bounded by
`PROBE_TIMEOUT_S`: it runs in a daemon thread that is abandoned when the time is up. Behind an
HTTP(S) proxy the request goes through it (urllib reads the same variables wandb does).
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import urllib.error
import urllib.request

from omegaconf import DictConfig, OmegaConf

from lab.errors import ConfigError

DEFAULT_BASE_URL = "https://api.wandb.ai"
PROBE_TIMEOUT_S = 10.0
ONLINE_MODES = ("online", "run")  # wandb's names for a run that talks to the server while it trains


def check_wandb_reachable(cfg: DictConfig) -> None:
    """With a wandb logger in online mode, the server answers as a wandb server within PROBE_TIMEOUT_S."""
    mode = OmegaConf.select(cfg, "logger.wandb.mode")
    if OmegaConf.select(cfg, "logger.wandb") is None or str(mode) not in ONLINE_MODES:
        return
    server = os.environ.get("WANDB_BASE_URL") or DEFAULT_BASE_URL
    problem = bounded(lambda: wandb_answer_problem(server), PROBE_TIMEOUT_S)
    if problem is not None:
        raise ConfigError("logger.wandb.mode", f"online, but {server} {problem}; run with WANDB_MODE=offline "
                                               "(and `wandb sync` the run later) or fix the network")


def wandb_answer_problem(server: str) -> str | None:
    """None when `server` answers the client's first request as a wandb server does; else what went wrong."""
    request = urllib.request.Request(f"{server.rstrip('/')}/graphql", data=json.dumps({"query": "{ viewer { id } }"}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:
            status, body = response.status, response.read(1 << 16)
    except urllib.error.HTTPError as error:  # 401 without a valid key is still a wandb server's answer
        status, body = error.code, error.read(1 << 16)
    except (OSError, ValueError, http.client.HTTPException) as error:  # URLError, socket errors, a malformed URL or answer
        return f"cannot be reached ({reason_of(error)})"
    try:
        json.loads(body)
    except ValueError:
        return f"does not answer as a wandb server (HTTP {status} to POST /graphql, not JSON)"
    return None


def reason_of(error: Exception) -> str:
    cause = getattr(error, "reason", error)  # URLError wraps the socket's error
    if isinstance(cause, TimeoutError) or "timed out" in str(cause):
        return "no answer"
    errno = getattr(cause, "errno", None)
    return os.strerror(errno).lower() if errno else str(cause)


def bounded(probe, seconds: float) -> str | None:
    """probe() in a daemon thread; its result, or "cannot be reached (no answer ...)" once `seconds` have passed."""
    result: list[str | None] = []

    def run() -> None:
        try:
            result.append(probe())
        except Exception as error:  # anything the HTTP stack raises is an answer that is not a wandb server's
            result.append(f"cannot be reached ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")

    thread = threading.Thread(target=run, name="wandb-probe", daemon=True)
    thread.start()
    thread.join(seconds)
    return result[0] if result else f"cannot be reached (no answer within {seconds:g} s)"

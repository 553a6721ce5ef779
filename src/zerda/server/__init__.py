"""``zerda serve``: Zerda's memories over HTTP, with API keys and tenants (extra ``server``).

Built on Starlette and uvicorn: Starlette is the small ASGI toolkit FastAPI itself stands on
(and the one the MCP SDK's HTTP transport is written for), without FastAPI's pydantic layer,
which would only repeat the checks Zerda's own message model makes. ``create_app(store)`` gives
the ASGI app; ``zerda serve`` runs it. See docs/serve.md.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from zerda.errors import ConfigurationError

try:
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ConfigurationError(
        "zerda serve needs the server extra: pip install 'zerda-memory[server]'"
    ) from exc

from starlette.applications import Starlette

from zerda.server._app import DEFAULT_MAX_BODY, create_app
from zerda.server._keys import ApiKey, KeyRing, Tenant, check_tenant
from zerda.stores._open import open_native_async, open_store

__all__ = [
    "DEFAULT_MAX_BODY",
    "ApiKey",
    "KeyRing",
    "Tenant",
    "app_from_environment",
    "check_tenant",
    "create_app",
    "log_to_stderr",
]

CONFIG_VARIABLE = "ZERDA_SERVE_CONFIG"
"""The environment variable through which ``zerda serve`` hands its settings to each worker
process (uvicorn starts workers by importing :func:`app_from_environment`)."""


def log_to_stderr() -> None:
    """Print Zerda's log (the access log included) on standard error, at INFO, once."""
    logger = logging.getLogger("zerda")
    if any(getattr(h, "zerda_serve", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.zerda_serve = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def app_from_environment() -> Starlette:
    """The app as ``zerda serve`` configured it, for uvicorn's worker processes."""
    log_to_stderr()
    raw = os.environ.get(CONFIG_VARIABLE)
    if not raw:
        raise ConfigurationError(f"{CONFIG_VARIABLE} is not set: start the server with zerda serve")
    config = json.loads(raw)
    store = open_store(config["db"])
    return create_app(
        store,
        auth=config["auth"],
        max_body=config["max_body"],
        counter=config["counter"],
        async_store=open_native_async(config["db"]),
    )

"""schemathesis against zerda serve's /openapi.json, with a valid key: whatever it sends, no
5xx, and every answer matches the document (status codes, content types, bodies)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed")
schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.core.parameters import ParameterLocation  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from zerda import Message  # noqa: E402
from zerda.server import KeyRing, create_app  # noqa: E402
from zerda.stores import InMemoryStore  # noqa: E402
from zerda.tokens import default_token_counter  # noqa: E402

STORE = InMemoryStore()
KEY, _ = KeyRing(STORE).create("fuzz")
# A session that exists, so that reads of it answer 200 as well as 404.
STORE.append("fuzz:ada", [Message("user", "A flat white."), Message("assistant", "Done.")])
APP = create_app(STORE, counter="approx", max_body=64 * 1024)
# counter=default in a request picks the default counter, decided once per process: offline,
# deciding it warns (a ZerdaWarning, which the suite turns into an error). Decide it here.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    default_token_counter()
# /mcp speaks JSON-RPC: the MCP SDK's own client tests it (tests/test_mcp.py).
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(path="/mcp")


@schema.parametrize()
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_route_answers_as_its_description_says(case: Any) -> None:
    # Every check but one: that a request the document allows is accepted. The API has rules
    # between fields that OpenAPI cannot state (k only with memory=window, a cursor this
    # server gave, messages Zerda can take), and it answers them with 4xx, as documented.
    # The key is sent, unless the case is about its headers being wrong (a missing
    # Authorization): adding a valid one would make a request that must fail succeed.
    headers = {} if headers_mutated(case) else {"Authorization": f"Bearer {KEY}"}
    case.call_and_validate(headers=headers, excluded_checks=[positive_data_acceptance])


def headers_mutated(case: Any) -> bool:
    """Whether schemathesis generated this case's headers to break the document."""
    meta = case.meta
    info = None if meta is None else meta.components.get(ParameterLocation.HEADER)
    return info is not None and info.mode is GenerationMode.NEGATIVE

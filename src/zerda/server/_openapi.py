"""The OpenAPI document of the service (``GET /openapi.json``), written as data.

Written by hand rather than generated: the bodies are Zerda messages, checked by Zerda itself,
and the document says exactly what each route answers, errors included.
"""

from __future__ import annotations

from typing import Any

__all__ = ["openapi"]

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}
_MESSAGE = {
    "type": "object",
    "description": "A message as an OpenAI Chat dict; Zerda's own fields (id, created_at, "
    "metadata, content parts) may be given and are returned by GET .../messages.",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "id": {"type": "string"},
    },
}
_SESSION_ID = {
    "name": "session_id",
    "in": "path",
    "required": True,
    "description": "Letters, digits and _ . : @ + = -; at most 200 characters less the "
    "tenant's name and a colon",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:@+=-]{1,200}$"},
}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "Bad input (a message or session id Zerda refuses, a body that is not JSON)",
        401: "No API key, or one that is unknown or revoked",
        404: "No such session for this tenant",
        413: "The body is over the server's limit",
        422: "A well-formed request with a wrong field or parameter",
        503: "The store is unavailable; retry after Retry-After seconds",
    }
    return {
        str(code): {
            "description": words[code],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for code in codes
    }


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _int_param(name: str, description: str, minimum: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": {"type": "integer", "minimum": minimum, "maximum": 999_999_999},
    }


def openapi() -> dict[str, Any]:
    """The document, built anew on each call (callers may change it)."""
    session = {
        "type": "object",
        "required": ["id", "messages", "turns", "created_at", "updated_at", "expires_at"],
        "properties": {
            "id": {"type": "string"},
            "messages": {"type": "integer"},
            "turns": {"type": "integer"},
            "created_at": {"type": "number"},
            "updated_at": {"type": "number"},
            "expires_at": {"type": ["number", "null"]},
        },
    }
    metadata = {
        "type": "object",
        "required": ["metadata"],
        "properties": {"metadata": {"type": "object"}},
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Zerda memory service",
            "version": "1",
            "description": "Conversation memory over HTTP: append messages, read the whole "
            "log or a context within a budget that every provider accepts.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": _ERROR, "Message": _MESSAGE, "Session": session},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/sessions": {
                "get": {
                    "summary": "This tenant's sessions, by id, a page at a time",
                    "parameters": [
                        _int_param("limit", "Sessions per page (at most 1000; default 100)"),
                        {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["sessions", "next_cursor"],
                                "properties": {
                                    "sessions": {
                                        "type": "array",
                                        "items": {"$ref": "#/components/schemas/Session"},
                                    },
                                    "next_cursor": {"type": ["string", "null"]},
                                },
                            }
                        ),
                        **_errors(401, 422, 503),
                    },
                }
            },
            "/v1/sessions/{session_id}/messages": {
                "parameters": [_SESSION_ID],
                "post": {
                    "summary": "Append messages as one atomic batch (idempotent by message id)",
                    "parameters": [
                        {
                            "name": "counter",
                            "in": "query",
                            "description": "Counter whose token counts are stored with them",
                            "schema": {"type": "string"},
                        }
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["messages"],
                                    "properties": {
                                        "format": {
                                            "type": "string",
                                            "enum": ["openai", "responses", "anthropic", "gemini"],
                                        },
                                        "messages": {"type": "array", "minItems": 1},
                                        "system": {},
                                        "system_instruction": {"type": "object"},
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "201": _json(
                            {
                                "type": "object",
                                "required": ["appended", "ids"],
                                "properties": {
                                    "appended": {"type": "integer"},
                                    "ids": {"type": "array", "items": {"type": "string"}},
                                },
                            },
                            "Stored: how many were new (a retry stores none), and every id",
                        ),
                        **_errors(400, 401, 413, 422, 503),
                    },
                },
                "get": {
                    "summary": "Every stored message, in order",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["messages"],
                                "properties": {
                                    "messages": {
                                        "type": "array",
                                        "items": {"$ref": "#/components/schemas/Message"},
                                    }
                                },
                            }
                        ),
                        **_errors(400, 401, 404, 503),
                    },
                },
            },
            "/v1/sessions/{session_id}/context": {
                "parameters": [_SESSION_ID],
                "get": {
                    "summary": "What to send to the model: exactly what the library's memory "
                    "returns, and its stats",
                    "parameters": [
                        {
                            "name": "memory",
                            "in": "query",
                            "schema": {
                                "type": "string",
                                "enum": ["buffer", "window", "token", "summary_buffer"],
                            },
                        },
                        _int_param("k", "Turns a window keeps (memory=window; default 5)"),
                        _int_param("token_limit", "Token budget (token, summary_buffer)"),
                        _int_param("reserve", "Tokens of the budget kept free", minimum=0),
                        {"name": "counter", "in": "query", "schema": {"type": "string"}},
                        {
                            "name": "format",
                            "in": "query",
                            "schema": {
                                "type": "string",
                                "enum": ["openai", "responses", "anthropic", "gemini", "zerda"],
                            },
                        },
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["messages", "stats"],
                                "properties": {"messages": {}, "stats": {"type": "object"}},
                            }
                        ),
                        **_errors(400, 401, 404, 422, 503),
                    },
                },
            },
            "/v1/sessions/{session_id}/metadata": {
                "parameters": [_SESSION_ID],
                "get": {
                    "summary": "The session's metadata (Zerda's own keys left out)",
                    "responses": {"200": _json(metadata), **_errors(400, 401, 404, 503)},
                },
                "patch": {
                    "summary": "Merge keys into the metadata; null deletes a key",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": metadata}},
                    },
                    "responses": {"200": _json(metadata), **_errors(400, 401, 413, 422, 503)},
                },
            },
            "/v1/sessions/{session_id}": {
                "parameters": [_SESSION_ID],
                "delete": {
                    "summary": "Delete the session: every message and its metadata",
                    "responses": {
                        "204": {"description": "Deleted"},
                        **_errors(400, 401, 404, 503),
                    },
                },
            },
            "/healthz": {
                "get": {
                    "summary": "Whether the server and its store answer (no key needed)",
                    "security": [],
                    "responses": {
                        "200": _json({"type": "object", "properties": {"status": {}}}),
                        **_errors(503),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "Prometheus text",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
        },
    }

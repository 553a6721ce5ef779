"""The OpenAPI document of the service (``GET /openapi.json``), written as data.

Written by hand rather than generated: the bodies are Zerda messages, checked by Zerda itself,
and the document says exactly what each route answers, errors included.
"""

from __future__ import annotations

from typing import Any

from zerda.messages import MAX_ID_LENGTH

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


_MESSAGE_ID = {
    "name": "message_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH},
}
_CONTENT = {
    "type": ["string", "null", "array"],
    "description": "Text, null (an assistant message with tool calls), or content parts as "
    "Message.to_dict gives them",
    "items": {"type": "object"},
}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "Bad input (a message or session id Zerda refuses, a body that is not JSON)",
        401: "No API key, or one that is unknown or revoked",
        403: "Not for a tenant: the operation is store-wide",
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


def _error(description: str) -> dict[str, Any]:
    """An error answer with its own description (where ``_errors``' words do not fit)."""
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


# The largest number a query parameter may hold (18 digits); larger ones get 422.
_MAX_INT = 10**18 - 1

_COUNTER = {
    "name": "counter",
    "in": "query",
    "description": "A token counter: approx, default, or a tiktoken encoding or model name",
    "schema": {"type": "string", "minLength": 1},
}


def _int_param(name: str, description: str, minimum: int = 1) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": {"type": "integer", "minimum": minimum, "maximum": _MAX_INT},
    }


def _memory_parameters() -> list[dict[str, Any]]:
    """The query parameters naming the memory a context or an inspection is of."""
    return [
        {
            "name": "memory",
            "in": "query",
            "schema": {"type": "string", "enum": ["buffer", "window", "token", "summary_buffer"]},
        },
        _int_param("k", "Turns a window keeps (memory=window; default 5)"),
        _int_param("token_limit", "Token budget (token, summary_buffer)"),
        _int_param("reserve", "Tokens of the budget kept free", minimum=0),
        dict(_COUNTER),
    ]


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
        "additionalProperties": False,
        "properties": {"metadata": {"type": "object"}},
    }
    counts = {"type": "array", "items": {"type": ["integer", "null"], "minimum": 0}}
    messages = {"type": "array", "items": {"$ref": "#/components/schemas/Message"}}
    tail = {
        "type": "object",
        "description": "The end of a session as a store reads it (zerda.stores.Tail)",
        "required": [
            "system",
            "messages",
            "turn_starts",
            "total_turns",
            "total_messages",
            "tokens",
            "system_tokens",
            "metadata",
        ],
        "properties": {
            "system": messages,
            "messages": messages,
            "turn_starts": {"type": "array", "items": {"type": "integer"}},
            "total_turns": {"type": "integer"},
            "total_messages": {"type": "integer"},
            "tokens": counts,
            "system_tokens": counts,
            "metadata": {"type": "object", "description": "Zerda's own keys included"},
        },
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
            "schemas": {"Error": _ERROR, "Message": _MESSAGE, "Session": session, "Tail": tail},
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/sessions": {
                "delete": {
                    "summary": "Delete every session of this tenant (without keys: of the store, "
                    "the expired ones too)",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["deleted"],
                                "properties": {"deleted": {"type": "integer"}},
                            }
                        ),
                        **_errors(401, 503),
                    },
                },
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
                },
            },
            "/v1/sessions/{session_id}/messages": {
                "parameters": [_SESSION_ID],
                "post": {
                    "summary": "Append messages as one atomic batch (idempotent by message id)",
                    "parameters": [_COUNTER],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["messages"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "format": {
                                            "type": "string",
                                            "description": "zerda: Zerda's own dicts, stored "
                                            "exactly as sent (no id or time added); the only "
                                            "format whose messages may be empty",
                                            "enum": [
                                                "openai",
                                                "responses",
                                                "anthropic",
                                                "gemini",
                                                "zerda",
                                            ],
                                        },
                                        "messages": {
                                            "type": "array",
                                            "items": {"type": "object"},
                                        },
                                        "system": {},
                                        "system_instruction": {"type": "object"},
                                        "tokens": {
                                            "type": "object",
                                            "description": "Counts to store instead of "
                                            "counting, one per message, by counter name "
                                            "(not with ?counter=)",
                                            "additionalProperties": {
                                                "type": "array",
                                                "items": {"type": "integer", "minimum": 0},
                                            },
                                        },
                                        "tail": {
                                            "type": "object",
                                            "description": "Answer the tail right after the "
                                            "append too",
                                            "properties": {
                                                "turns": {"type": ["integer", "null"]},
                                                "counter": {"type": ["string", "null"]},
                                            },
                                        },
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
                                    "ids": {
                                        "type": "array",
                                        "items": {"type": ["string", "null"]},
                                    },
                                    "tail": {"$ref": "#/components/schemas/Tail"},
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
                        *_memory_parameters(),
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
            "/v1/sessions/{session_id}/inspect": {
                "parameters": [_SESSION_ID],
                "get": {
                    "summary": "One account of the context (memory.inspect()): its messages, "
                    "every stored turn's fate and tokens, each repair, the tokens by part, "
                    "the stats",
                    "parameters": [
                        *_memory_parameters(),
                        _int_param(
                            "turns",
                            "The newest stored turns to account for message by message "
                            "(default 50)",
                            minimum=0,
                        ),
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["context", "fates", "tokens", "turns", "stats"],
                                "properties": {
                                    "context": {"type": "array"},
                                    "fates": {"type": "object"},
                                    "tokens": {"type": "object"},
                                    "turns": {"type": "array"},
                                    "stats": {"type": "object"},
                                },
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
                    "parameters": [
                        {
                            "name": "reserved",
                            "in": "query",
                            "description": "true: with Zerda's own keys (a summary's state)",
                            "schema": {"type": "string", "enum": ["true", "false"]},
                        }
                    ],
                    "responses": {"200": _json(metadata), **_errors(400, 401, 404, 422, 503)},
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
            "/v1/sessions/{session_id}/tail": {
                "parameters": [_SESSION_ID],
                "get": {
                    "summary": "The newest turns as a store reads them (what HTTPStore.tail "
                    "answers); an empty tail for a session that is not there",
                    "parameters": [
                        _int_param("turns", "Turns to read (all when left out)", minimum=0),
                        {
                            "name": "counter",
                            "in": "query",
                            "description": "Counter whose stored counts to give",
                            "schema": {"type": "string", "minLength": 1},
                        },
                    ],
                    "responses": {
                        "200": _json({"$ref": "#/components/schemas/Tail"}),
                        **_errors(400, 401, 422, 503),
                    },
                },
            },
            "/v1/sessions/{session_id}/compare-and-set": {
                "parameters": [_SESSION_ID],
                "post": {
                    "summary": "Set one metadata key if it holds the value expected, atomically "
                    "(any key, Zerda's own included)",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["key", "expected", "value"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "key": {"type": "string", "minLength": 1},
                                        "expected": {"description": "null: absent"},
                                        "value": {"description": "null: delete the key"},
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["swapped"],
                                "properties": {"swapped": {"type": "boolean"}},
                            }
                        ),
                        **_errors(400, 401, 413, 422, 503),
                    },
                },
            },
            "/v1/sessions/{session_id}/delete-messages": {
                "parameters": [_SESSION_ID],
                "post": {
                    "summary": "Delete the session's messages with these ids, system messages "
                    "too, with their token counts, atomically (what HTTPStore.delete_messages "
                    "does; ids the session does not hold are ignored)",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["ids"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "ids": {
                                            "type": "array",
                                            "items": {"type": "string", "minLength": 1},
                                        }
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["deleted"],
                                "properties": {"deleted": {"type": "integer"}},
                            },
                            "How many messages were deleted",
                        ),
                        **_errors(400, 401, 413, 422, 503),
                    },
                },
            },
            "/v1/sessions/{session_id}/pop-turn": {
                "parameters": [_SESSION_ID],
                "post": {
                    "summary": "Remove the newest turn (system messages stay) and answer its "
                    "messages, atomically (what HTTPStore.pop_turn does); none for no turn",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["messages"],
                                "properties": {"messages": messages},
                            },
                            "The messages removed, in order, as Message.to_dict gives them",
                        ),
                        **_errors(400, 401, 503),
                    },
                },
            },
            "/v1/sessions/{session_id}/fork-session": {
                "parameters": [_SESSION_ID],
                "post": {
                    "summary": "Copy the session's log up to and including message at (null "
                    "or left out: all of it), with its token counts and metadata, into a new "
                    "session of this tenant, atomically (what HTTPStore.fork does)",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["new_session_id"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "new_session_id": {
                                            "type": "string",
                                            "description": "The new session's id, in this "
                                            "tenant (as the path's session_id)",
                                            "pattern": "^[A-Za-z0-9_.:@+=-]{1,200}$",
                                        },
                                        "at": {"type": ["string", "null"]},
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["copied"],
                                "properties": {"copied": {"type": "integer"}},
                            },
                            "How many messages were copied (0 for a session that holds "
                            "nothing: nothing is created)",
                        ),
                        **_errors(400, 401),
                        "404": _error("The session holds no message at"),
                        "409": _error("The new session already holds messages or metadata"),
                        **_errors(413, 422, 503),
                    },
                },
            },
            "/v1/sessions/{session_id}/edit-message": {
                "parameters": [_SESSION_ID],
                "post": {
                    "summary": "Replace one message's content, atomically (what "
                    "HTTPStore.edit_message does): the rest stays, its metadata gains "
                    "edited_at and its token counts are dropped",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["message_id", "content"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "message_id": {"type": "string"},
                                        "content": {
                                            "type": ["string", "null", "array"],
                                            "description": "Text, null, or content parts "
                                            "as Message.to_dict gives them",
                                            "items": {"type": "object"},
                                        },
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["message"],
                                "properties": {"message": {"$ref": "#/components/schemas/Message"}},
                            },
                            "The message as stored",
                        ),
                        **_errors(400, 401),
                        "404": _error("The session holds no message with that id"),
                        **_errors(413, 422, 503),
                    },
                },
            },
            "/v1/sessions/purge-expired": {
                "post": {
                    "summary": "Delete the store's expired sessions (a server without keys "
                    "only: purging is store-wide)",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["purged"],
                                "properties": {"purged": {"type": "integer"}},
                            }
                        ),
                        **_errors(401, 403, 503),
                    },
                }
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
            "/v1/sessions/{session_id}/messages/{message_id}": {
                "parameters": [_SESSION_ID, _MESSAGE_ID],
                "delete": {
                    "summary": "Delete one message; an assistant message's tool calls take "
                    "their results with them, and a summary that held the message is dropped "
                    "(docs/editing.md)",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["deleted"],
                                "properties": {
                                    "deleted": {
                                        "type": "integer",
                                        "description": "Messages deleted, results included",
                                    }
                                },
                            }
                        ),
                        **_errors(400, 401),
                        "404": _error("No such session, or no message with that id in it"),
                        **_errors(503),
                    },
                },
                "patch": {
                    "summary": "Replace one message's content; its id, role and place stay, "
                    "its metadata records edited_at, a summary that held it is dropped",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["content"],
                                    "additionalProperties": False,
                                    "properties": {"content": _CONTENT},
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["message"],
                                "properties": {"message": {"$ref": "#/components/schemas/Message"}},
                            },
                            "The message as stored",
                        ),
                        **_errors(400, 401),
                        "404": _error("No such session, or no message with that id in it"),
                        **_errors(413, 422, 503),
                    },
                },
            },
            "/v1/sessions/{session_id}/pop": {
                "parameters": [_SESSION_ID],
                "post": {
                    "summary": "Remove the newest turn (regenerate an answer, roll back a "
                    "step); system messages stay",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "required": ["messages"],
                                "properties": {
                                    "messages": {
                                        "type": "array",
                                        "items": {"$ref": "#/components/schemas/Message"},
                                        "description": "The turn removed; empty for none",
                                    }
                                },
                            }
                        ),
                        **_errors(400, 401, 404, 503),
                    },
                },
            },
            "/v1/sessions/{session_id}/fork": {
                "parameters": [_SESSION_ID],
                "post": {
                    "summary": "Copy the session's log up to and including the message at "
                    "(all of it without at) into a new session of the same tenant",
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["new_session_id"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "new_session_id": _SESSION_ID["schema"],
                                        "at": {"type": ["string", "null"]},
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "201": _json(
                            {
                                "type": "object",
                                "required": ["session_id", "messages"],
                                "properties": {
                                    "session_id": {"type": "string"},
                                    "messages": {"type": "integer"},
                                },
                            },
                            "Forked: the new session and how many messages it holds",
                        ),
                        **_errors(400, 401),
                        "404": _error("No such session, or no message at that id in it"),
                        "409": _error("The new session already holds messages or metadata"),
                        **_errors(413, 422, 503),
                    },
                },
            },
            "/mcp": {
                "post": {
                    "summary": "The MCP tools (Streamable HTTP, stateless, JSON answers; extra "
                    "mcp): append_messages, get_context, inspect_context, get_history, "
                    "list_sessions, delete_session, pop_turn, delete_message, edit_message, "
                    "fork_session. A JSON-RPC message in, its answer out",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    "responses": {
                        "200": _json({"type": "object"}, "The JSON-RPC answer"),
                        **_errors(401),
                    },
                }
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

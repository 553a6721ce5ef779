"""The service's operations as MCP tools: at ``/mcp`` of ``zerda serve`` and over stdio.

The tools do their work as the REST handlers do theirs, through the same helpers (the memory
``_memory`` builds, the format converters, the error answers), for the tenant each call comes
from: over HTTP the one whose API key the request carries, checked before the MCP SDK sees the
request; over stdio (``zerda mcp``) the one named at start-up. The SDK is the ``mcp`` extra,
imported only when the tools are built: without it ``/mcp`` is not mounted.
"""

# No ``from __future__ import annotations`` here: the SDK reads the tools' signatures to
# describe them to the host, and the names those use are imported where the tools are defined.

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from starlette.requests import Request
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from zerda.errors import ConfigurationError, ZerdaError
from zerda.server._http import ApiError, describe_error, error_response
from zerda.server._keys import Tenant, check_tenant
from zerda.stores._base import Store

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.types import CallToolResult

    from zerda.server._app import _Service

__all__ = ["MCP_HINT", "mcp_installed", "mcp_mount", "require_mcp", "serve_stdio"]

Lifespan = Callable[[Any], AbstractAsyncContextManager[None]]

MCP_HINT = "pip install 'zerda-memory[mcp]'"

_Tool = TypeVar("_Tool", bound=Callable[..., Any])

# The request scope key under which /mcp leaves the tenant its key belongs to, for the tools.
_TENANT = "zerda.mcp.tenant"

INSTRUCTIONS = """\
Zerda keeps conversations, one session per conversation, and gives back the context to send
the model: the newest turns that fit a budget, repaired so that every tool call has its
result. Append each exchange with append_messages as it happens; before calling the model,
ask get_context for the session with the budget you can spend (token_limit) or the number of
turns to keep (k). Session ids are yours to choose. pop_turn, delete_message, edit_message and
fork_session regenerate, roll back, correct and branch a conversation."""


def mcp_installed() -> bool:
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError:
        return False
    return True


def require_mcp() -> None:
    """Refuse, with the install hint, when the ``mcp`` extra is not installed."""
    if not mcp_installed():
        raise ConfigurationError(f"the MCP tools need the mcp extra: {MCP_HINT}")


def mcp_mount(service: "_Service") -> tuple[list[BaseRoute], Lifespan | None]:
    """The route of ``/mcp`` and the lifespan it needs; nothing without the ``mcp`` extra."""
    if not mcp_installed():
        return [], None
    endpoint = _Endpoint(service, _server(service, _tenant_of_request))
    # POST only: stateless, there is no stream to open with GET and no session to DELETE
    # (405 for both is what the transport's spec says to answer then).
    return [Route("/mcp", endpoint, methods=["POST"])], endpoint.lifespan


async def serve_stdio(store: Store, *, tenant: str | None = None, counter: str = "default") -> None:
    """Serve the tools over standard input and output until the client closes them.

    ``tenant`` names the namespace the session ids are in (as an API key of that tenant
    would); ``None`` gives the store's own ids, as ``zerda serve --no-auth`` does.
    """
    require_mcp()
    from zerda.server._app import DEFAULT_MAX_BODY, _Service
    from zerda.server._http import Metrics

    fixed = Tenant(None if tenant is None else check_tenant(tenant))
    service = _Service(
        store, auth=False, max_body=DEFAULT_MAX_BODY, counter=counter, metrics=Metrics()
    )
    await _server(service, lambda ctx: fixed).run_stdio_async()


# -- over HTTP --------------------------------------------------------------------------------


class _Endpoint:
    """``/mcp``: the API key checked as the REST API checks it (401 before the SDK reads
    anything), then the SDK's streamable HTTP transport, stateless.

    Stateless: every POST stands alone, so any worker of ``zerda serve --workers N`` can answer
    it, and no MCP session outlives the request whose key was checked.
    """

    def __init__(self, service: "_Service", server: "MCPServer") -> None:
        self.service = service
        self.server = server
        self.manager: StreamableHTTPSessionManager | None = None

    @asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        from mcp.server.transport_security import TransportSecuritySettings

        # A session manager runs once: each start of the app makes a new one.
        self.server.streamable_http_app(
            stateless_http=True,
            json_response=True,
            max_request_body_size=self.service.max_body,
            # The key is the protection: a page that rebinds a name to this server cannot
            # send one. (The SDK would otherwise allow only 127.0.0.1 and localhost as Host.)
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        manager = self.server.session_manager
        async with manager.run():
            self.manager = manager
            try:
                yield
            finally:
                self.manager = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["zerda.route"] = "/mcp"
        try:
            tenant = await self.service.tenant(Request(scope, receive))
        except Exception as exc:  # the REST API's answer: 401 without a valid key
            await error_response(*describe_error(exc))(scope, receive, send)
            return
        if self.manager is None:
            response = error_response(
                503, "Unavailable", "/mcp is not running: start the app with its lifespan"
            )
            await response(scope, receive, send)
            return
        scope[_TENANT] = tenant
        await self.manager.handle_request(scope, receive, send)


def _tenant_of_request(ctx: "Context") -> Tenant:
    """The tenant ``/mcp`` found for the HTTP request that carries this call."""
    request = ctx.request_context.request
    tenant = request.scope.get(_TENANT) if isinstance(request, Request) else None
    if not isinstance(tenant, Tenant):  # only _Endpoint serves these tools over HTTP
        raise ApiError(401, "Unauthorized", "send an API key: Authorization: Bearer KEY")
    return tenant


# -- the tools --------------------------------------------------------------------------------


@contextlib.contextmanager
def _answering() -> Iterator[None]:
    """Zerda's errors as tool errors, with the message the REST API answers with (and logged
    as it logs them). Anything else is the SDK's to report: it logs the traceback and tells the
    host only that the tool failed."""
    from mcp.server.mcpserver.exceptions import ToolError

    try:
        yield
    except (ApiError, ZerdaError) as exc:
        _, _, message = describe_error(exc)
        raise ToolError(message) from None


def _answer(value: dict[str, Any]) -> "CallToolResult":
    """A tool's result: ``value`` as structured content, and as compact JSON text for hosts that
    show the model text (the SDK's own text is indented: tokens for nothing)."""
    from mcp.types import CallToolResult, TextContent

    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=value)


def _server(service: "_Service", who: Callable[["Context"], Tenant]) -> "MCPServer":
    """The tools over ``service``, each call for the tenant ``who`` says it comes from."""
    import logging

    from mcp.server.mcpserver import Context, MCPServer
    from mcp.types import CallToolResult, ToolAnnotations
    from pydantic import Field

    from zerda import __version__
    from zerda.server import _app

    # MCPServer() calls logging.basicConfig(), which would set up the whole process's logging
    # (and print Zerda's log twice): with a handler on the root logger, that call does nothing.
    root = logging.getLogger()
    guard = logging.NullHandler()
    root.addHandler(guard)
    try:
        mcp = MCPServer("zerda", version=__version__, instructions=INSTRUCTIONS)
    finally:
        root.removeHandler(guard)

    SessionId = Annotated[
        str,
        Field(
            description="The conversation's id, yours to choose: A-Z a-z 0-9 _ . : @ + = -, "
            "up to 150 characters. A new id starts a new conversation."
        ),
    ]
    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def tool(annotations: ToolAnnotations) -> Callable[[_Tool], _Tool]:
        """Register a tool, its docstring (on one line) as its description."""

        def register(fn: _Tool) -> _Tool:
            description = " ".join((fn.__doc__ or "").split())
            mcp.add_tool(fn, description=description, annotations=annotations)
            return fn

        return register

    @tool(ToolAnnotations(read_only_hint=False, open_world_hint=False))
    async def append_messages(
        ctx: Context,
        session_id: SessionId,
        messages: Annotated[
            list[dict[str, Any]],
            Field(
                min_length=1,
                description="The messages to add after the session's last one, oldest first, "
                "in the format `format` names. In OpenAI Chat form: {'role': 'user', "
                "'content': '...'}, {'role': 'assistant', 'content': None, 'tool_calls': "
                "[...]}, {'role': 'tool', 'tool_call_id': '...', 'content': '...'}. A message "
                "may carry an 'id': one already stored is skipped, so resending is safe.",
            ),
        ],
        format: Annotated[
            Literal["openai", "responses", "anthropic", "gemini"],
            Field(
                description="openai: OpenAI Chat messages (or Zerda's own form); responses: "
                "OpenAI Responses input items; anthropic: Anthropic messages; gemini: Gemini "
                "contents"
            ),
        ] = "openai",
        system: Annotated[
            Any,
            Field(
                description="With format anthropic, its 'system' (a string or text blocks); "
                "with gemini, its 'system_instruction'. Other formats send system messages "
                "in messages."
            ),
        ] = None,
    ) -> CallToolResult:
        """Add messages to a conversation (created by its first message). All are checked
        first: if one is invalid, nothing is stored. Returns how many were new and every
        message's id."""
        with _answering():
            stored = who(ctx).stored_id(session_id)
            body: dict[str, Any] = {"messages": messages, "format": format}
            if system is not None:  # as the REST body names it for that format
                if format not in ("anthropic", "gemini"):
                    raise ApiError(
                        422,
                        "InvalidParameter",
                        f"system goes with format anthropic or gemini; with {format}, send "
                        "system messages in messages",
                    )
                body["system_instruction" if format == "gemini" else "system"] = system
            return _answer(await service.append_body(stored, body))

    # The memory a context or an inspection is of.
    TokenLimit = Annotated[
        int | None,
        Field(
            ge=1,
            description="The token budget of the context: the newest turns that fit it. "
            "Implies memory 'token' unless memory is given.",
        ),
    ]
    K = Annotated[
        int | None,
        Field(
            ge=1,
            description="Keep the last k turns (a turn: a user message and all that "
            "answers it). Implies memory 'window'; not with token_limit.",
        ),
    ]
    MemoryKind = Annotated[
        Literal["buffer", "window", "token", "summary_buffer"] | None,
        Field(
            description="buffer: every turn; window: the last k (default 5); token: the "
            "newest that fit token_limit (default 2000); summary_buffer: token, with a "
            "summary of the older turns. Default: token with token_limit, window with k, "
            "else buffer.",
        ),
    ]
    Reserve = Annotated[
        int | None,
        Field(ge=0, description="Tokens of the budget to keep free (token, summary_buffer)"),
    ]
    Counter = Annotated[
        str | None,
        Field(
            description="Token counter for the budget: approx, or a tiktoken encoding or "
            "model name (default: the server's)"
        ),
    ]

    def memory_params(**given: object) -> dict[str, str]:
        return {name: str(value) for name, value in given.items() if value is not None}

    @tool(reading)
    async def get_context(
        ctx: Context,
        session_id: SessionId,
        token_limit: TokenLimit = None,
        k: K = None,
        memory: MemoryKind = None,
        reserve: Reserve = None,
        counter: Counter = None,
        format: Annotated[
            Literal["openai", "responses", "anthropic", "gemini", "zerda"],
            Field(
                description="The messages' format: openai (a list of chat messages), "
                "responses (input items), anthropic ({system, messages}), gemini "
                "({system_instruction, contents}) or zerda (Zerda's own dicts)"
            ),
        ] = "openai",
    ) -> CallToolResult:
        """What to send the model for a conversation: the context a Zerda memory gives, within
        the budget, repaired so every tool call has its result and a provider accepts it,
        with the memory's stats (tokens used, turns kept and evicted)."""
        with _answering():
            stored = who(ctx).stored_id(session_id)
            params = memory_params(
                memory=memory,
                k=k,
                token_limit=token_limit,
                reserve=reserve,
                counter=counter,
                format=format,
            )
            return _answer(await service.context_of(stored, session_id, params))

    @tool(reading)
    async def inspect_context(
        ctx: Context,
        session_id: SessionId,
        token_limit: TokenLimit = None,
        k: K = None,
        memory: MemoryKind = None,
        reserve: Reserve = None,
        counter: Counter = None,
        turns: Annotated[
            int,
            Field(
                ge=0,
                le=_app.MAX_PAGE,
                description="The newest stored turns to account for message by message",
            ),
        ] = _app.DEFAULT_INSPECTED,
    ) -> CallToolResult:
        """Why the context is what it is: for the memory get_context would use, where every
        stored turn went (context, summary, pending, evicted) and its tokens, what was
        repaired in each message (a result moved after its call, an unanswered call
        removed, a text cut), the tokens by part and the stats."""
        with _answering():
            stored = who(ctx).stored_id(session_id)
            params = memory_params(
                memory=memory,
                k=k,
                token_limit=token_limit,
                reserve=reserve,
                counter=counter,
                turns=turns,
            )
            return _answer(await service.inspection_of(stored, session_id, params))

    @tool(reading)
    async def get_history(ctx: Context, session_id: SessionId) -> CallToolResult:
        """Every stored message of a conversation, oldest first, in Zerda's lossless form
        (with ids and times): the whole log, not a budgeted context."""
        with _answering():
            stored = who(ctx).stored_id(session_id)
            return _answer({"messages": await service.history_of(stored, session_id)})

    @tool(reading)
    async def list_sessions(
        ctx: Context,
        limit: Annotated[int, Field(ge=1, le=_app.MAX_PAGE, description="Sessions a page")] = (
            _app.DEFAULT_PAGE
        ),
        cursor: Annotated[
            str | None, Field(description="The next_cursor of the previous page")
        ] = None,
    ) -> CallToolResult:
        """The conversations stored, sorted by id, a page at a time: each one's id, messages,
        turns and times. next_cursor is null on the last page."""
        with _answering():
            sessions = await service.astore.alist_sessions()
            return _answer(service.sessions_page(who(ctx), sessions, limit, cursor))

    @tool(ToolAnnotations(destructive_hint=True, open_world_hint=False))
    async def delete_session(ctx: Context, session_id: SessionId) -> CallToolResult:
        """Delete a conversation: every message and its metadata. It cannot be undone."""
        with _answering():
            stored = who(ctx).stored_id(session_id)
            await service.delete(stored, session_id)
            return _answer({"deleted": session_id})

    MessageId = Annotated[
        str, Field(description="A message's id, as get_history and append_messages give it")
    ]
    destructive = ToolAnnotations(destructive_hint=True, open_world_hint=False)

    @tool(destructive)
    async def pop_turn(ctx: Context, session_id: SessionId) -> CallToolResult:
        """Remove the newest turn of a conversation (its user message and everything after)
        and return its messages: to regenerate an answer or roll back a step."""
        with _answering():
            stored = who(ctx).stored_id(session_id)
            return _answer({"messages": await service.pop(stored, session_id)})

    @tool(destructive)
    async def delete_message(
        ctx: Context, session_id: SessionId, message_id: MessageId
    ) -> CallToolResult:
        """Delete one message; an assistant message's tool calls take their results with
        them, and a summary that held the message is dropped. Returns how many went."""
        with _answering():
            stored = who(ctx).stored_id(session_id)
            return _answer(
                {"deleted": await service.delete_message(stored, session_id, message_id)}
            )

    @tool(ToolAnnotations(read_only_hint=False, open_world_hint=False))
    async def edit_message(
        ctx: Context,
        session_id: SessionId,
        message_id: MessageId,
        content: Annotated[
            str | None, Field(description="The new text (null only for a tool-calling message)")
        ],
    ) -> CallToolResult:
        """Replace one message's text; its id, role and place stay. Returns it as stored."""
        with _answering():
            stored = who(ctx).stored_id(session_id)
            message = await service.edit(stored, session_id, message_id, content)
            return _answer({"message": message})

    @tool(ToolAnnotations(read_only_hint=False, open_world_hint=False))
    async def fork_session(
        ctx: Context,
        session_id: SessionId,
        new_session_id: SessionId,
        at: Annotated[
            str | None,
            Field(description="Copy up to and including this message id; null: all of it"),
        ] = None,
    ) -> CallToolResult:
        """Branch a conversation: copy it (up to the message `at`) into a new conversation,
        leaving it unchanged. Returns how many messages the new one holds."""
        with _answering():
            tenant = who(ctx)
            stored = tenant.stored_id(session_id)
            held = await service.fork(tenant, stored, session_id, new_session_id, at)
            return _answer({"session_id": new_session_id, "messages": held})

    return mcp

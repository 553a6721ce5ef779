"""The session inspector at ``/ui``: what the model saw, in a browser.

Server-rendered pages (:mod:`zerda.server._ui_html`) over the service's own operations, with
the same tenants as the API. Signing in stores the API key in an HTTP-only, ``SameSite=Strict``
cookie scoped to ``/ui``; every form carries a token derived from the signed-in key (an HMAC
with a secret of this process), and a POST without it, or from another origin, is refused.
Pages send a Content-Security-Policy that allows no script at all, and images only from the
page's own data URLs.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from zerda.errors import ZerdaError
from zerda.memory import BaseMemory, ConversationBufferMemory
from zerda.server._http import ApiError, describe_error, query_int
from zerda.server._keys import Tenant
from zerda.server._ui_html import (
    TURNS_PER_PAGE,
    MemoryForm,
    confirm_page,
    error_page,
    fork_page,
    login_page,
    page,
    session_page,
    session_view,
    sessions_page,
)

if TYPE_CHECKING:
    from zerda.server._app import _Service

__all__ = ["COOKIE", "TURNS_PER_PAGE", "ui_routes"]

COOKIE = "zerda_ui_key"
SESSIONS_PER_PAGE = 50
_MAX_FORM = 16 * 1024
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
_Handler = Callable[[Request], Awaitable[Response]]


class _Refused(Exception):
    """A request the inspector answers with a page saying why (not JSON)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _SignIn(Exception):
    """No valid key: send the browser to the sign-in page."""


class _UI:
    def __init__(self, service: _Service) -> None:
        self.service = service
        self.secret = secrets.token_bytes(32)
        self.css = resources.files("zerda.server").joinpath("inspector.css").read_bytes()

    # -- who is asking --------------------------------------------------------------------------

    async def tenant(self, request: Request) -> Tenant:
        if not self.service.auth:
            return Tenant(None)
        key = request.cookies.get(COOKIE, "")
        record = await self.service.keys.alookup(self.service.astore, key) if key else None
        if record is None:
            raise _SignIn
        request.scope["zerda.tenant"] = record.tenant
        return Tenant(record.tenant)

    def csrf(self, request: Request) -> str:
        """The form token of whoever is signed in (the same for every form of theirs)."""
        who = request.cookies.get(COOKIE, "") if self.service.auth else "open"
        return hmac.new(self.secret, b"form:" + who.encode(), hashlib.sha256).hexdigest()

    async def form(self, request: Request, *, token: str | None = None) -> dict[str, str]:
        """The fields of a POSTed form, once it proves it comes from one of our pages: the
        same origin (when the browser says), and the form token."""
        origin = request.headers.get("origin")
        if origin is not None and origin != "null":
            own = f"{request.url.scheme}://{request.url.netloc}"
            if origin.rstrip("/") != own:
                raise _Refused(403, f"a form from {origin} cannot act here")
        if "application/x-www-form-urlencoded" not in request.headers.get("content-type", ""):
            raise _Refused(415, "send the form as application/x-www-form-urlencoded")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > _MAX_FORM:
                raise _Refused(413, "the form is too large")
        try:
            fields = dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True))
        except (UnicodeDecodeError, ValueError):
            raise _Refused(400, "the form is not valid") from None
        expected = token if token is not None else self.csrf(request)
        if not hmac.compare_digest(fields.get("csrf", ""), expected):
            raise _Refused(403, "the form has expired or did not come from this page: reload it")
        return fields

    def base(self, request: Request) -> str:
        """The path the app is mounted at behind a proxy (``--root-path``), for links."""
        return str(request.scope.get("root_path", "")).rstrip("/")

    def html(
        self, request: Request, title: str, body: str, tenant: Tenant, status: int = 200
    ) -> Response:
        text = page(
            title,
            body,
            base=self.base(request),
            tenant=tenant.name,
            csrf=self.csrf(request),
            auth=self.service.auth,
        )
        return HTMLResponse(text, status_code=status, headers=_HEADERS)

    def back_to(self, request: Request, path: str) -> Response:
        return RedirectResponse(self.base(request) + path, status_code=303, headers=_HEADERS)

    # -- sign in and out ------------------------------------------------------------------------

    def login_token(self) -> str:
        return hmac.new(self.secret, b"login", hashlib.sha256).hexdigest()

    async def login_form(self, request: Request) -> Response:
        if not self.service.auth:
            return self.back_to(request, "/ui")
        next_path = _local(request.query_params.get("next", "/ui"))
        text = login_page(
            base=self.base(request), csrf=self.login_token(), next_path=next_path, problem=None
        )
        return HTMLResponse(text, headers=_HEADERS)

    async def login(self, request: Request) -> Response:
        if not self.service.auth:
            return self.back_to(request, "/ui")
        fields = await self.form(request, token=self.login_token())
        key = fields.get("key", "").strip()
        next_path = _local(fields.get("next", "/ui"))
        record = await self.service.keys.alookup(self.service.astore, key) if key else None
        if record is None:
            text = login_page(
                base=self.base(request),
                csrf=self.login_token(),
                next_path=next_path,
                problem="That key is not valid here (unknown or revoked).",
            )
            return HTMLResponse(text, status_code=401, headers=_HEADERS)
        answer = self.back_to(request, next_path)
        answer.set_cookie(
            COOKIE,
            key,
            path=self.base(request) + "/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return answer

    async def logout(self, request: Request) -> Response:
        await self.form(request)
        answer = self.back_to(request, "/ui/login")
        answer.delete_cookie(COOKIE, path=self.base(request) + "/ui")
        return answer

    # -- pages ----------------------------------------------------------------------------------

    async def sessions(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        prefix = request.query_params.get("prefix", "")
        number = query_int(request.query_params, "page", minimum=1) or 1
        mine = [
            s
            for s in tenant.visible(await self.service.astore.alist_sessions())
            if s.session_id.startswith(prefix)
        ]
        mine.sort(key=lambda s: (s.updated_at, s.session_id), reverse=True)
        pages = max(1, math.ceil(len(mine) / SESSIONS_PER_PAGE))
        shown = mine[(number - 1) * SESSIONS_PER_PAGE : number * SESSIONS_PER_PAGE]
        body = sessions_page(
            shown,
            base=self.base(request),
            prefix=prefix,
            page_number=number,
            pages=pages,
            total=len(mine),
        )
        return self.html(request, "Sessions", body, tenant)

    async def session(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        session_id = request.path_params["session_id"]
        stored = tenant.stored_id(session_id)
        params = request.query_params
        number = query_int(params, "page", minimum=1) or 1
        form = _memory_form(params)
        problem = None
        memory: BaseMemory[Any] | None = None
        try:
            memory = self.service.memory_for(stored, form.query())  # no I/O: settings only
        except (ApiError, ZerdaError) as exc:
            problem = describe_error(exc)[2]
        shown = memory or ConversationBufferMemory(store=self.service.astore, session_id=stored)
        # One account of the page: the newest turns down to this page's oldest, with what the
        # context made of each (the counts stored with the messages: none is counted again).
        inspection = await shown.ainspect(
            turns=number * TURNS_PER_PAGE, token_counter=self.service.counter
        )
        if not inspection.stats["stored_messages"] and not inspection.system:
            await self.service.require(stored, session_id)
        if inspection.error is not None and problem is None:
            problem = describe_error(inspection.error)[2]
        view = session_view(
            session_id, inspection, number, form, problem, with_context=memory is not None
        )
        body = session_page(view, base=self.base(request), csrf=self.csrf(request))
        return self.html(request, f"Session {session_id}", body, tenant)

    # -- actions: a confirmation page, then a form POST ----------------------------------------

    async def confirm(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        session_id = request.path_params["session_id"]
        stored = tenant.stored_id(session_id)
        await self.service.require(stored, session_id)
        here = f"{self.base(request)}/ui/sessions/{quote(session_id, safe='')}"
        action = request.query_params.get("action", "")
        csrf = self.csrf(request)
        message_id = request.query_params.get("message", "")
        # Each action: what to ask, the button that says yes, and what the form carries.
        questions: dict[str, tuple[str, str, dict[str, str]]] = {
            "delete": (f"Delete the session {session_id!r} and every message in it?", "Delete", {}),
            "pop": (f"Remove the newest turn of {session_id!r}?", "Pop the turn", {}),
            "delete-message": (
                f"Delete the message {message_id!r} (a call takes its results with it)?",
                "Delete the message",
                {"message": message_id},
            ),
        }
        if action == "fork":
            body = fork_page(here=here, csrf=csrf)
        elif action in questions:
            question, button, fields = questions[action]
            body = confirm_page(
                question=question,
                action=f"{here}/{action}",
                csrf=csrf,
                back=here,
                fields=fields,
                button=button,
            )
        else:
            raise _Refused(404, f"no action {action!r}: delete, pop, fork or delete-message")
        return self.html(request, "Confirm", body, tenant)

    async def act(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        fields = await self.form(request)
        session_id = request.path_params["session_id"]
        stored = tenant.stored_id(session_id)
        action = request.path_params["action"]
        here = f"/ui/sessions/{quote(session_id, safe='')}"
        service = self.service
        if action == "delete":
            await service.delete(stored, session_id)
            return self.back_to(request, "/ui")
        if action == "pop":
            await service.pop(stored, session_id)
        elif action == "delete-message":
            await service.delete_message(stored, session_id, fields.get("message", ""))
        elif action == "fork":
            new_id = fields.get("new_session_id", "")
            await service.fork(tenant, stored, session_id, new_id, fields.get("at") or None)
            return self.back_to(request, f"/ui/sessions/{quote(new_id, safe='')}")
        else:
            raise _Refused(404, f"no action {action!r}")
        return self.back_to(request, here)

    async def stylesheet(self, request: Request) -> Response:
        return Response(
            self.css,
            media_type="text/css",
            headers={"Cache-Control": "max-age=3600", "X-Content-Type-Options": "nosniff"},
        )

    # -- errors as pages --------------------------------------------------------------------------

    def guarded(self, template: str, handler: _Handler) -> _Handler:
        """``handler``, answering every error with a page, and naming its route for the log
        and the metrics."""

        async def answer(request: Request) -> Response:
            request.scope["zerda.route"] = template
            try:
                return await handler(request)
            except _SignIn:
                if request.method != "GET":
                    status, message = 403, "sign in first"
                else:
                    target = request.url.path + (
                        f"?{request.url.query}" if request.url.query else ""
                    )
                    return self.back_to(request, f"/ui/login?next={quote(_local(target), safe='')}")
            except _Refused as exc:
                status, message = exc.status, exc.message
            except Exception as exc:  # an API error, a Zerda error: a page, never a traceback
                status, _, message = describe_error(exc)
            body = error_page(status, message, base=self.base(request))
            text = page(
                "Error",
                body,
                base=self.base(request),
                tenant=None,
                csrf=None,
                auth=self.service.auth,
            )
            return HTMLResponse(text, status_code=status, headers=_HEADERS)

        answer.__name__ = handler.__name__
        return answer


def _memory_form(params: Mapping[str, str]) -> MemoryForm:
    """The memory settings of the query string; the default shows a 2,000-token budget."""
    values = {k: params.get(k, "").strip() for k in ("k", "token_limit", "reserve", "counter")}
    memory = params.get("memory", "").strip()
    if not memory:
        memory = "window" if values["k"] else "token"
        if memory == "token" and not values["token_limit"]:
            values["token_limit"] = "2000"
    return MemoryForm(memory=memory, **values)


def _local(path: str) -> str:
    """``path`` if it is a page of the inspector, else the sessions page: a sign-in never
    sends the browser to another site."""
    parts = urlsplit(path)
    if parts.scheme or parts.netloc or not parts.path.startswith("/ui") or "\\" in path:
        return "/ui"
    return path


def ui_routes(service: _Service) -> list[BaseRoute]:
    ui = _UI(service)
    session = "/ui/sessions/{session_id}"
    pages: list[tuple[str, _Handler, str]] = [
        ("/ui", ui.sessions, "GET"),
        ("/ui/", ui.sessions, "GET"),
        ("/ui/login", ui.login_form, "GET"),
        ("/ui/login", ui.login, "POST"),
        ("/ui/logout", ui.logout, "POST"),
        (session, ui.session, "GET"),
        (session + "/confirm", ui.confirm, "GET"),
        (session + "/{action}", ui.act, "POST"),
    ]
    routes: list[BaseRoute] = [
        Route(path, ui.guarded(path, handler), methods=[method]) for path, handler, method in pages
    ]
    routes.append(Route("/ui/static/inspector.css", ui.stylesheet, methods=["GET"]))
    return routes

"""``zerda serve``, ``zerda keys`` and ``zerda mcp``: the service's commands."""

from __future__ import annotations

import argparse
import errno
import functools
import json
import os
import socket
from typing import TYPE_CHECKING, Any

from zerda.cli._render import local_time, table
from zerda.errors import ConfigurationError, ZerdaError
from zerda.stores._open import open_native_async, open_store
from zerda.tokens import counter_by_name

if TYPE_CHECKING:
    from zerda.cli._commands import Context
    from zerda.server import KeyRing

__all__ = ["cmd_keys", "cmd_mcp", "cmd_serve"]


def cmd_keys(args: argparse.Namespace, ctx: Context) -> int:
    # zerda.server says which extra to install when it is missing.
    from zerda.cli._commands import _reading, _writing
    from zerda.server import KeyRing

    if args.keys_action == "create":
        with _writing(ctx) as store:
            _create_key(KeyRing(store), args.tenant, ctx)
        return 0
    with _reading(ctx) as found:  # listing or revoking never creates a store
        ring = None if found is None else KeyRing(found)
        if args.keys_action == "list":
            _list_keys(ring, ctx)
            return 0
        revoked = None if ring is None else ring.revoke(args.key_id)
    if revoked is None:
        missing = " (the file does not exist)" if ring is None else ""
        raise ConfigurationError(
            f"no API key {args.key_id!r} in {ctx.shown}{missing}; 'zerda keys list' shows them"
        )
    print(f"revoked key {revoked.key_id} of tenant {revoked.tenant!r}", file=ctx.out)
    return 0


def _create_key(ring: KeyRing, tenant: str, ctx: Context) -> None:
    key, record = ring.create(tenant)
    if ctx.json:
        body = {"key": key, "key_id": record.key_id, "tenant": record.tenant}
        print(json.dumps(body), file=ctx.out)
        return
    print(key, file=ctx.out)
    print(
        f"key {record.key_id} for tenant {record.tenant!r} in {ctx.shown}: keep it now, it is "
        "not shown again (the store keeps only its hash)",
        file=ctx.err,
    )


def _list_keys(ring: KeyRing | None, ctx: Context) -> None:
    records = [] if ring is None else ring.list()
    if ctx.json:
        rows = [
            {"key_id": r.key_id, "tenant": r.tenant, "created_at": r.created_at} for r in records
        ]
        print(json.dumps(rows, indent=2), file=ctx.out)
    elif not records:
        print(
            f"no API keys in {ctx.shown}; 'zerda keys create --tenant NAME' makes one",
            file=ctx.out,
        )
    else:
        rows_text = [["KEY ID", "TENANT", "CREATED"]] + [
            [r.key_id, r.tenant, local_time(r.created_at)] for r in records
        ]
        print("\n".join(table(rows_text, "lll")), file=ctx.out)


def cmd_serve(args: argparse.Namespace, ctx: Context) -> int:
    import uvicorn

    from zerda.server import CONFIG_VARIABLE, KeyRing, create_app, log_to_stderr
    from zerda.server._mcp import MCP_HINT, mcp_installed

    log_to_stderr()
    _check_port(args.host, args.port)

    store = open_store(ctx.target)  # opening checks the target (and creates a SQLite file)
    auth = not args.no_auth
    if not auth:
        print(
            "zerda serve: WARNING: --no-auth: no API keys are checked; anyone who can connect "
            f"to {args.host}:{args.port} reads and writes every session of {ctx.shown}. "
            "For local development only.",
            file=ctx.err,
        )
    elif not KeyRing(store).list():
        print(
            f"zerda serve: no API keys in {ctx.shown} yet: every request will be refused "
            "(401) until 'zerda keys create --tenant NAME' makes one",
            file=ctx.err,
        )
    mcp = "MCP at /mcp" if mcp_installed() else f"no MCP ({MCP_HINT})"
    print(
        f"zerda serve: {ctx.shown} on http://{args.host}:{args.port} "
        f"({args.workers} worker{'s' if args.workers != 1 else ''}; "
        f"API under /v1, {mcp}, description at /openapi.json, inspector at /ui)",
        file=ctx.err,
    )
    settings = {
        "host": args.host,
        "port": args.port,
        "access_log": False,
        "log_config": None,
        "root_path": args.root_path.rstrip("/"),
    }
    if args.workers == 1:
        app = create_app(
            store,
            auth=auth,
            max_body=args.max_body,
            counter=args.counter,
            async_store=open_native_async(ctx.target),
        )
        try:
            _run(uvicorn, app, settings)
        finally:
            store.close()
        return 0
    store.close()
    counter_by_name(args.counter)  # a bad name fails here, a warning about it shows once
    config = {"db": ctx.target, "auth": auth, "max_body": args.max_body, "counter": args.counter}
    os.environ[CONFIG_VARIABLE] = json.dumps(config)
    _run(
        uvicorn,
        "zerda.server:app_from_environment",
        {**settings, "factory": True, "workers": args.workers},
    )
    return 0


def _check_port(host: str, port: int) -> None:
    """Fail in one line, before anything starts, when ``host:port`` cannot be listened on
    (another process has it, the address is not this machine's), as uvicorn would bind it."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as exc:
        raise ConfigurationError(f"cannot serve on {host}:{port}: {exc}") from None
    probe = socket.socket(family, kind, proto)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        probe.bind(address)
    except OSError as exc:
        hint = (
            "another process is listening there: stop it, or give another --port"
            if exc.errno == errno.EADDRINUSE
            else "give a --host of this machine, and a --port you may use"
        )
        raise ZerdaError(f"cannot serve on {host}:{port}: {exc.strerror}; {hint}") from None
    finally:
        probe.close()


def _run(uvicorn: Any, app: object, settings: dict[str, Any]) -> None:
    """uvicorn.run, with its failure to start (the port taken meanwhile) as Zerda's error."""
    try:
        uvicorn.run(app, **settings)
    except SystemExit as stop:
        if stop.code in (None, 0):
            raise
        raise ZerdaError(
            f"the server did not start on {settings['host']}:{settings['port']} (uvicorn "
            "said why above)"
        ) from None


def cmd_mcp(args: argparse.Namespace, ctx: Context) -> int:
    import anyio

    # zerda.server says which extra to install when it is missing; require_mcp, for mcp.
    from zerda.server import check_tenant
    from zerda.server._mcp import require_mcp, serve_stdio

    require_mcp()
    if args.tenant is not None:
        check_tenant(args.tenant)
    counter_by_name(args.counter)  # a bad name fails here, a warning about it shows once
    store = open_store(ctx.target)
    try:
        ids = "the store's own session ids" if args.tenant is None else f"tenant {args.tenant!r}"
        print(f"zerda mcp: {ctx.shown} ({ids}) over standard input and output", file=ctx.err)
        anyio.run(functools.partial(serve_stdio, store, tenant=args.tenant, counter=args.counter))
    finally:
        store.close()
    return 0

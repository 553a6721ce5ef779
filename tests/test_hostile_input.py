"""Hostile input gets a Zerda error, never another exception, and no output shows a password.

Hypothesis throws arbitrary messages, metadata, session ids, import lines and store targets at
the library; the CLI is run in-process on the lines and addresses a careless user would send.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerda.cli import main
from zerda.cli._jsonl import parse_jsonl
from zerda.errors import ZerdaError
from zerda.messages import MAX_METADATA_DEPTH, Message
from zerda.stores import InMemoryStore, JSONFileStore, SQLiteStore, check_session_id
from zerda.stores._base import redact
from zerda.stores._open import open_store, parse_target

PASSWORD = "Pw-s3cret"

# -- what hypothesis sends -------------------------------------------------------------------

# Any text, lone surrogates included (Python strings may hold them; no store can).
texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    texts,
)
json_like = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(texts | st.integers(), inner, max_size=3)
        | st.tuples(inner)
        | st.sets(st.integers(), max_size=2)
    ),
    max_leaves=12,
)


def deep(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value} if depth % 2 else [value]
    return value


nested = st.integers(min_value=MAX_METADATA_DEPTH - 2, max_value=3 * MAX_METADATA_DEPTH).map(deep)
messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", 3])},
    optional={
        "content": st.one_of(texts, st.none(), json_like),
        "name": st.one_of(texts, st.none(), st.integers()),
        "tool_call_id": st.one_of(texts, st.none()),
        "tool_calls": st.one_of(
            st.none(),
            json_like,
            st.lists(
                st.fixed_dictionaries(
                    {
                        "id": texts,
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries({"name": texts, "arguments": texts}),
                    }
                ),
                max_size=2,
            ),
        ),
        "metadata": st.one_of(json_like, nested, st.dictionaries(texts, nested, max_size=1)),
        "created_at": st.one_of(scalars, st.just(10**400)),
        "id": st.one_of(texts, st.none(), st.integers(), st.text(min_size=250, max_size=300)),
    },
)


def only_zerda_errors(call: Callable[[], object]) -> None:
    with contextlib.suppress(ZerdaError):
        call()


@settings(max_examples=300, deadline=None)
@given(messages)
def test_any_message_dict_is_a_message_or_a_zerda_error(data: dict[str, Any]) -> None:
    only_zerda_errors(lambda: Message.from_dict(data))
    try:
        text = json.dumps(data, default=str)
    except (ValueError, RecursionError):  # the test's own encoding gave up (a 400-digit int)
        return
    only_zerda_errors(lambda: Message.from_json(text))


@settings(max_examples=200, deadline=None)
@given(st.one_of(texts, json_like), st.one_of(json_like, nested), st.one_of(texts, st.integers()))
def test_any_message_fields_are_a_message_or_a_zerda_error(
    content: Any, metadata: Any, message_id: Any
) -> None:
    only_zerda_errors(lambda: Message("user", content))
    only_zerda_errors(lambda: Message("user", "x", metadata=metadata))
    only_zerda_errors(lambda: Message("user", "x", id=message_id))


@settings(max_examples=300, deadline=None)
@given(st.one_of(texts, st.text(max_size=300), st.integers(), st.binary(), st.none()))
def test_any_session_id_is_valid_or_a_zerda_error(session_id: Any) -> None:
    only_zerda_errors(lambda: check_session_id(session_id))


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Any]]:
    folder = tmp_path_factory.mktemp("fuzz")
    made = [InMemoryStore(), SQLiteStore(folder / "f.db"), JSONFileStore(folder / "f.json")]
    yield made
    for store in made:
        store.close()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.one_of(st.dictionaries(texts, json_like | nested, max_size=3), json_like),
    st.one_of(texts, st.integers()),
    json_like,
)
def test_any_session_metadata_is_stored_equal_or_a_zerda_error(
    stores: list[Any], values: Any, key: Any, value: Any
) -> None:
    for store in stores:
        try:
            store.update_metadata("fuzz", values)
        except ZerdaError:
            pass
        else:
            kept = {k: v for k, v in values.items() if v is not None}
            assert {k: store.get_metadata("fuzz")[k] for k in kept} == json.loads(json.dumps(kept))
        only_zerda_errors(lambda s=store: s.compare_and_set("fuzz", key, None, value))  # type: ignore[misc]


def encodable(data: dict[str, Any]) -> bool:
    try:
        json.dumps(data, default=repr)
    except (ValueError, RecursionError):
        return False
    return True


lines = st.one_of(
    st.binary(max_size=40),
    st.builds(lambda d: json.dumps(d, default=repr).encode(), messages.filter(encodable)),
    st.integers(min_value=1, max_value=200_000).map(lambda n: b"[" * n),
    st.integers(min_value=4_000, max_value=20_000).map(
        lambda n: b'{"role": "user", "content": "x", "metadata": {"n": ' + b"9" * n + b"}}"
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(lines, min_size=1, max_size=4))
def test_any_import_file_is_parsed_or_reported_line_by_line(raw: list[bytes]) -> None:
    data = b"\n".join(line.replace(b"\n", b" ") for line in raw)
    parsed = parse_jsonl(data, "f.jsonl")
    for problem in parsed.problems:
        assert problem.startswith("f.jsonl:"), problem
        assert problem.split(":")[1].isdigit(), problem


@settings(max_examples=300, deadline=None)
@given(st.one_of(texts, st.text(max_size=60), st.sampled_from(["redis://", "postgresql://"])))
def test_any_store_target_parses_or_is_a_zerda_error(target: str) -> None:
    only_zerda_errors(lambda: parse_target(target))


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["redis://", "rediss://", "postgresql://", "redis+cluster://"]),
    st.text(st.characters(codec="ascii"), max_size=30),
)
def test_any_server_address_opens_lazily_or_is_a_zerda_error(scheme: str, rest: str) -> None:
    """Opening a server store connects on first use: a bad address fails here, cleanly."""

    def open_and_close() -> None:
        open_store(scheme + rest).close()

    only_zerda_errors(open_and_close)


# -- the CLI, in-process --------------------------------------------------------------------


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ZERDA_DB", raising=False)
    return tmp_path


def test_import_reports_every_hostile_line_with_its_number(
    home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = [
        b'{"role": "user", "content": "fine"}',
        b"[" * 100_000,
        b'{"role": "user", "content": "x", "metadata": {"n": ' + b"9" * 10_000 + b"}}",
        b'{"role": "user", "content": "half a pair \\ud800 here"}',
        json.dumps({"role": "user", "content": "deep", "metadata": deep(100)}).encode(),
        b'{"role": "user", "content": "x", "id": "' + b"i" * 300 + b'"}',
        b"\xff\xfe not utf-8",
    ]
    path = home / "hostile.jsonl"
    path.write_bytes(b"\n".join(hostile) + b"\n")
    code = main(["--db", str(home / "z.db"), "import", str(path), "--session", "s"])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err
    where = re.compile(rf"zerda: error: {re.escape(str(path))}:(\d+): \S")
    numbers = [int(where.match(line).group(1)) for line in err.splitlines()[:-1]]  # type: ignore[union-attr]
    assert numbers == [2, 3, 4, 5, 6, 7], err
    assert err.splitlines()[-1] == f"zerda: error: nothing imported: 6 bad lines in {path}"
    assert not (home / "z.db").exists()


ADDRESSES = [
    f"redis://:{PASSWORD}@127.0.0.1:1/0",
    f"redis://user:{PASSWORD}@127.0.0.1:1/0",
    f"redis://127.0.0.1:1/0?password={PASSWORD}",
    f"redis://127.0.0.1:1/0?db=0&PassWord={PASSWORD}",
    f"rediss+cluster://:{PASSWORD}@127.0.0.1:1",
    f"postgresql://u:{PASSWORD}@127.0.0.1:1/db",
    f"postgresql://u@127.0.0.1:1/db?password={PASSWORD}",
    f"host=127.0.0.1 port=1 user=u password={PASSWORD} dbname=d",
    f"host=127.0.0.1 port=1 user=u password='{PASSWORD} x' dbname=d",
]


@pytest.mark.parametrize("address", ADDRESSES)
def test_no_output_shows_a_password(
    address: str, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["sessions"], ["show", "s"], ["stats"], ["migrate"]):
        code = main(["--db", address, *command])
        out, err = capsys.readouterr()
        # Nothing answers there; Redis has no schema, so migrate has nothing to do there.
        assert code != 0 or command == ["migrate"], (command, out, err)
        assert PASSWORD not in out + err, (command, err)
        assert "Traceback" not in err
    assert os.listdir(home) == [], "a store address became a file"


@pytest.mark.parametrize("address", ADDRESSES)
def test_no_repr_or_error_shows_a_password(address: str) -> None:
    assert PASSWORD not in redact(address)
    try:
        store = open_store(address)
    except ZerdaError as exc:
        refused: ZerdaError | None = exc
    else:
        refused = None
    if refused is not None:
        assert PASSWORD not in str(refused)
        return
    try:
        assert PASSWORD not in repr(store)
        assert PASSWORD not in str(getattr(store, "url", "")) + str(getattr(store, "dsn", ""))
        with pytest.raises(ZerdaError) as caught:
            store.list_sessions()
        chain: BaseException | None = caught.value
        while chain is not None:  # the chained backend errors too
            assert PASSWORD not in str(chain)
            chain = chain.__cause__
    finally:
        store.close()

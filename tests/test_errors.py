"""The error hierarchy of zerda.errors: one root, the documented subclasses, pickling."""

from __future__ import annotations

import pickle
import re

import pytest

from zerda import errors
from zerda.errors import (
    ChatError,
    ConfigurationError,
    ContextOverflowError,
    CorruptDataError,
    InvalidMessageError,
    InvalidSessionIdError,
    MessageNotFoundError,
    ModelError,
    SessionExistsError,
    StoreUnavailableError,
    SummarizerError,
    ToolLoopError,
    ZerdaError,
    ZerdaWarning,
)

SUBCLASSES = [
    ConfigurationError,
    InvalidMessageError,
    InvalidSessionIdError,
    MessageNotFoundError,
    SessionExistsError,
    StoreUnavailableError,
    ContextOverflowError,
    SummarizerError,
    ChatError,
    ModelError,
    ToolLoopError,
    CorruptDataError,
]


def _drawn_hierarchy() -> list[str]:
    """The class names in the tree drawn in errors.py's module docstring."""
    assert errors.__doc__ is not None
    pattern = r"^[\s│]*(?:[├└]── )?(Zerda\w+|\w+Error|\w+Warning)\b"
    return re.findall(pattern, errors.__doc__, re.MULTILINE)


def test_all_is_exactly_the_documented_set() -> None:
    assert set(errors.__all__) == {
        "ZerdaError",
        "ConfigurationError",
        "InvalidMessageError",
        "InvalidSessionIdError",
        "MessageNotFoundError",
        "SessionExistsError",
        "StoreUnavailableError",
        "ContextOverflowError",
        "SummarizerError",
        "ChatError",
        "ModelError",
        "ToolLoopError",
        "CorruptDataError",
        "ZerdaWarning",
        "ApproximateCountWarning",
    }
    assert len(errors.__all__) == len(set(errors.__all__))


def test_all_matches_the_hierarchy_drawn_in_the_docstring() -> None:
    assert sorted(_drawn_hierarchy()) == sorted(errors.__all__)


@pytest.mark.parametrize("cls", SUBCLASSES, ids=lambda c: c.__name__)
def test_every_subclass_derives_from_zerda_error(cls: type[Exception]) -> None:
    assert issubclass(cls, ZerdaError)
    assert cls is not ZerdaError


def test_every_drawn_error_is_a_zerda_error() -> None:
    drawn = [
        name for name in _drawn_hierarchy() if name != "ZerdaError" and not name.endswith("Warning")
    ]
    assert {getattr(errors, name) for name in drawn} == set(SUBCLASSES)


def test_zerda_error_is_an_exception() -> None:
    assert issubclass(ZerdaError, Exception)


@pytest.mark.parametrize("cls", [ConfigurationError, InvalidMessageError], ids=lambda c: c.__name__)
def test_bad_value_errors_are_value_errors(cls: type[Exception]) -> None:
    """Callers that catch ValueError around Zerda calls keep working."""
    with pytest.raises(ValueError, match="bad"):
        raise cls("bad")


def test_zerda_warning_is_a_user_warning_not_an_error() -> None:
    assert issubclass(ZerdaWarning, UserWarning)
    assert not issubclass(ZerdaWarning, ZerdaError)


class TestContextOverflowError:
    def test_keeps_needed_and_limit(self) -> None:
        err = ContextOverflowError(
            "newest turn needs 120 tokens, budget is 100", needed=120, limit=100
        )
        assert err.needed == 120
        assert err.limit == 100
        assert str(err) == "newest turn needs 120 tokens, budget is 100"

    def test_needed_and_limit_are_keyword_only(self) -> None:
        with pytest.raises(TypeError):
            ContextOverflowError("too big", 120, 100)  # type: ignore[misc]

    def test_survives_pickle(self) -> None:
        err = ContextOverflowError("too big", needed=120, limit=100)
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is ContextOverflowError
        assert (str(copy), copy.needed, copy.limit) == ("too big", 120, 100)

    def test_is_caught_as_zerda_error(self) -> None:
        with pytest.raises(ZerdaError) as excinfo:
            raise ContextOverflowError("too big", needed=2, limit=1)
        assert excinfo.value.needed == 2  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "cls",
    [c for c in SUBCLASSES if c not in (ContextOverflowError, ModelError)],
    ids=lambda c: c.__name__,
)
def test_other_errors_survive_pickle(cls: type[Exception]) -> None:
    copy = pickle.loads(pickle.dumps(cls("session 'a/b' is not valid")))
    assert type(copy) is cls
    assert str(copy) == "session 'a/b' is not valid"


def test_model_error_keeps_its_endpoint_and_status_through_pickle() -> None:
    error = ModelError("model 'm' at http://x/v1: HTTP 500", endpoint="http://x/v1", status=500)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is ModelError
    assert (str(copy), copy.endpoint, copy.status) == (str(error), "http://x/v1", 500)
    assert isinstance(copy, ChatError)
    assert issubclass(ToolLoopError, ChatError)


def test_a_missing_message_is_a_key_error_that_reads_plainly() -> None:
    error = MessageNotFoundError("session 's' holds no message 'x'")
    assert isinstance(error, KeyError)
    assert str(error) == "session 's' holds no message 'x'"  # KeyError would add quotes
    assert isinstance(SessionExistsError("taken"), ValueError)

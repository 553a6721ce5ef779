"""zerda.chat tools: the schema read from a function, and running the calls a model writes."""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional, TypedDict

import pytest

from zerda import ConfigurationError
from zerda.chat import Tool, schema_of, tool


class Size(enum.Enum):
    SMALL = "small"
    LARGE = "large"


@dataclass
class Address:
    street: str
    number: int = 1


class Item(TypedDict):
    name: str
    quantity: int


def order(
    drink: Literal["latte", "flat white"],
    size: Size,
    quantity: int = 1,
    milk: str | None = None,
    extras: list[str] | None = None,
    price: Annotated[float, "the price in euros"] = 3.5,
    deliver_to: Address | None = None,
    basket: list[Item] | None = None,
    notes: dict[str, str] | None = None,
    urgent: bool = False,
) -> str:
    """Order a drink at the counter.

    The barista starts at once.

    Args:
        drink: what to make
        size: the cup
        quantity: how many cups,
            at most ten
        milk (str): the milk, if any

    Returns:
        The order id.
    """
    return f"{quantity} {size.value} {drink}"


def test_the_schema_comes_from_the_signature_hints_and_docstring() -> None:
    made = tool(order)
    assert made.name == "order"
    assert made.description == "Order a drink at the counter.\n\nThe barista starts at once."
    assert made.parameters == {
        "type": "object",
        "properties": {
            "drink": {
                "type": "string",
                "enum": ["latte", "flat white"],
                "description": "what to make",
            },
            "size": {"type": "string", "enum": ["small", "large"], "description": "the cup"},
            "quantity": {
                "type": "integer",
                "description": "how many cups, at most ten",
                "default": 1,
            },
            "milk": {"type": "string", "description": "the milk, if any", "default": None},
            "extras": {"type": "array", "items": {"type": "string"}, "default": None},
            "price": {"type": "number", "description": "the price in euros", "default": 3.5},
            "deliver_to": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "number": {"type": "integer"}},
                "required": ["street"],
                "default": None,
            },
            "basket": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "quantity": {"type": "integer"}},
                    "required": ["name", "quantity"],
                },
                "default": None,
            },
            "notes": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "default": None,
            },
            "urgent": {"type": "boolean", "default": False},
        },
        "required": ["drink", "size"],
        "additionalProperties": False,
    }
    assert made.definition == {
        "type": "function",
        "function": {
            "name": "order",
            "description": made.description,
            "parameters": made.parameters,
        },
    }


def sphinx(city: str, days: int) -> str:
    """Forecast the weather.

    :param city: the city's name
    :param int days: how many days ahead
    """
    return city


def numpy_style(city: str, days: int, **more: Any) -> str:
    """Forecast the weather.

    Parameters
    ----------
    city : str
        The city's name.
    days : int
        How many days
        ahead.

    Returns
    -------
    str
    """
    return city


@pytest.mark.parametrize("fn", [sphinx, numpy_style], ids=lambda f: f.__name__)
def test_sphinx_and_numpy_docstrings_describe_parameters(fn: Any) -> None:
    schema = schema_of(fn)
    described = {k: v.get("description", "").lower() for k, v in schema["properties"].items()}
    assert described == {
        "city": "the city's name" + ("." if fn is numpy_style else ""),
        "days": "how many days ahead" + ("." if fn is numpy_style else ""),
    }
    assert schema["required"] == ["city", "days"]
    assert tool(fn).description == "Forecast the weather."
    # **kwargs lets the model send more names than the signature lists
    assert ("additionalProperties" in schema) is (fn is sphinx)


def test_other_types() -> None:
    def f(
        a: tuple[int, ...],
        b: tuple[int, str],
        c: int | str,
        d: Optional[float],  # noqa: UP045 - the old spelling is read too
        e: Any,
        f: object,
        g: set[int],
        h: dict,  # type: ignore[type-arg]
        i,  # type: ignore[no-untyped-def]
    ) -> None:
        """No sections."""

    properties = schema_of(f)["properties"]
    assert properties == {
        "a": {"type": "array", "items": {"type": "integer"}},
        "b": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
        "c": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "d": {"type": "number"},
        "e": {},
        "f": {},
        "g": {"type": "array", "items": {"type": "integer"}},
        "h": {"type": "object"},
        "i": {},
    }


def test_explicit_name_description_and_parameters_win() -> None:
    parameters = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    @tool(name="search_menu", description="Search the menu.", parameters=parameters)
    def search(q: str) -> list[str]:
        """Ignored."""
        return [q]

    assert isinstance(search, Tool)
    assert search.definition["function"] == {
        "name": "search_menu",
        "description": "Search the menu.",
        "parameters": parameters,
    }
    assert search("tea") == ["tea"]  # still callable as the function
    assert tool(search).name == "search"  # re-wrapping starts from the function


def test_bad_tools_are_refused_with_a_reason() -> None:
    with pytest.raises(ConfigurationError, match="1 to 64 letters"):
        tool(order, name="order drinks")
    with pytest.raises(ConfigurationError, match="type 'object'"):
        tool(order, parameters={"type": "string"})
    with pytest.raises(ConfigurationError, match="must be a function"):
        tool(42)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="description must be a str"):
        Tool(order, "order", description=None)  # type: ignore[arg-type]


def test_calls_run_with_converted_arguments_and_errors_become_results() -> None:
    made = tool(order)
    assert made.call(json.dumps({"drink": "latte", "size": "large", "quantity": 2})) == (
        "2 large latte",
        False,
    )
    text, failed = made.call(json.dumps({"drink": "latte"}))
    assert failed
    assert "missing a required argument: 'size'" in json.loads(text)["error"]
    text, failed = made.call(json.dumps({"drink": "latte", "size": "large", "sugar": 2}))
    assert failed
    assert "unexpected keyword argument 'sugar'" in json.loads(text)["error"]
    assert made.call("[1, 2]") == (
        json.dumps({"error": "the arguments must be a JSON object, got list"}),
        True,
    )
    # An empty arguments string is no arguments.
    assert tool(lambda: "hi", name="hello").call("") == ("hi", False)
    # Results that are not text are JSON; dataclasses become objects.
    assert tool(lambda: Address("Main", 3), name="where").call("{}") == (
        json.dumps({"street": "Main", "number": 3}),
        False,
    )
    assert tool(lambda: None, name="nothing").call("{}") == ("null", False)

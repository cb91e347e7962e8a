"""@tool: JSON schema from type hints, descriptions from docstrings, context injection."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal, Optional

import pytest

from agentrl.toolbox import Tool, ToolBox, ToolContext, tool
from agentrl.toolbox.schema import parse_docstring


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class Custom:
    """A type JSON schema cannot describe."""


def test_schema_of_every_supported_type() -> None:
    @tool
    def f(
        i: int,
        x: float,
        s: str,
        flag: bool,
        ids: list[int],
        anything: list,
        blob: dict,
        weights: dict[str, float],
        unit: Literal["c", "f"],
        maybe: Optional[int],
        maybe2: str | None,
        pair: tuple[int, str],
        free: Any,
        limit: int = 10,
        ratio: float = 0.5,
        name: str = "x",
        on: bool = False,
        opt: int | None = None,
        tags: list[str] = [],  # noqa: B006 - not a simple default: no "default" key
    ) -> str:
        """Everything."""
        return ""

    assert f.parameters == {
        "type": "object",
        "properties": {
            "i": {"type": "integer"},
            "x": {"type": "number"},
            "s": {"type": "string"},
            "flag": {"type": "boolean"},
            "ids": {"type": "array", "items": {"type": "integer"}},
            "anything": {"type": "array"},
            "blob": {"type": "object"},
            "weights": {"type": "object", "additionalProperties": {"type": "number"}},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "maybe": {"type": ["integer", "null"]},
            "maybe2": {"type": ["string", "null"]},
            "pair": {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "minItems": 2,
                "maxItems": 2,
            },
            "free": {},
            "limit": {"type": "integer", "default": 10},
            "ratio": {"type": "number", "default": 0.5},
            "name": {"type": "string", "default": "x"},
            "on": {"type": "boolean", "default": False},
            "opt": {"type": ["integer", "null"], "default": None},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["i", "x", "s", "flag", "ids", "anything", "blob", "weights", "unit", "maybe", "maybe2", "pair", "free"],
        "additionalProperties": False,
    }


def test_union_and_nullable_literal_schemas() -> None:
    @tool
    def g(a: int | str, b: Literal["x", "y"] | None = None, c: list[int] | None = None, d: Literal[1, "one"] = 1) -> None:
        """G."""

    props = g.parameters["properties"]
    assert props["a"] == {"type": ["integer", "string"]}
    assert props["b"] == {"type": ["string", "null"], "enum": ["x", "y", None], "default": None}
    assert props["c"] == {"type": ["array", "null"], "items": {"type": "integer"}, "default": None}
    assert props["d"] == {"type": ["integer", "string"], "enum": [1, "one"], "default": 1}


def test_docstring_descriptions_google_style() -> None:
    @tool
    def search(query: str, k: int = 3, lang: str = "en") -> str:
        """Search the corpus for passages.

        Longer explanation on a second paragraph.

        Args:
            query (str): what to look for,
                possibly over two lines
            k: how many results
        Returns:
            The passages, one per line.
        """
        return ""

    assert search.name == "search"
    assert search.description == "Search the corpus for passages.\n\nLonger explanation on a second paragraph."
    props = search.parameters["properties"]
    assert props["query"] == {"type": "string", "description": "what to look for, possibly over two lines"}
    assert props["k"] == {"type": "integer", "description": "how many results", "default": 3}
    assert props["lang"] == {"type": "string", "default": "en"}  # no description in the docstring: tolerated
    assert search.schema() == {
        "type": "function",
        "function": {"name": "search", "description": search.description, "parameters": search.parameters},
    }


def test_docstring_sphinx_and_missing() -> None:
    d = parse_docstring("Do it.\n\n:param x: the x\n:param int y: the y\n:returns: nothing")
    assert d.description == "Do it." and d.args == {"x": "the x", "y": "the y"}

    def bare(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="has no description"):  # issue 32: tests/test_tool_docstrings.py
        tool(bare)


def test_overrides_and_still_callable() -> None:
    @tool(name="plus", description="Adds.", timeout=2.5, max_output_tokens=7)
    def add2(a: int, b: int = 1) -> int:
        """Ignored description."""
        return a + b

    assert isinstance(add2, Tool)
    assert (add2.name, add2.description, add2.timeout, add2.max_output_tokens) == ("plus", "Adds.", 2.5, 7)
    assert add2(a=1, b=2) == 3 and add2(4) == 5
    assert add(a=1, b=2) == 3 and add.timeout is None


def test_context_parameter_hidden_and_injected() -> None:
    @tool
    def counter(step: int, ctx: ToolContext) -> int:
        """Count per trajectory.

        Args:
            step: increment
        """
        ctx.state["n"] = int(ctx.state.get("n", 0)) + step
        return ctx.state["n"]  # type: ignore[return-value]

    assert counter.parameters["properties"] == {"step": {"type": "integer", "description": "increment"}}
    assert counter.parameters["required"] == ["step"]
    box = ToolBox([counter])
    a, b = box.new_context("a"), box.new_context("b")

    async def go() -> list[str]:
        return [(await box.execute("counter", {"step": s}, c)).content for s, c in [(1, a), (2, a), (5, b)]]

    assert run(go()) == ["1", "3", "5"]
    # The model cannot smuggle its own value for the context.
    r = run(box.execute("counter", {"step": 1, "ctx": {}}, a))
    assert r.error == "invalid_arguments" and "unexpected argument 'ctx'" in r.content


def test_string_annotations_resolve() -> None:
    def f(a: "int", ctx: "ToolContext") -> "str":
        """F."""
        return str(a + len(ctx.trajectory_id))

    t = tool(f)
    assert t.parameters["properties"] == {"a": {"type": "integer"}}
    assert run(ToolBox([t]).execute("f", {"a": 1}, ToolContext("abc"))).content == "4"


def test_decoration_errors_name_the_fix() -> None:
    def untyped(a):  # type: ignore[no-untyped-def]
        return a

    with pytest.raises(TypeError, match="no type hint"):
        tool(untyped)

    def star(**kw: int) -> None:
        pass

    with pytest.raises(TypeError, match=r"\*\*kwargs"):
        tool(star)

    def custom(c: Custom) -> None:
        pass

    with pytest.raises(TypeError, match="cannot describe type"):
        tool(custom)
    with pytest.raises(ValueError, match="two tools are named 'add'"):
        ToolBox([add, add])


def test_annotated_description_and_redecoration() -> None:
    @tool
    def f(a: Annotated[int, "how many"], b: Annotated[str, "ignored: the docstring wins"] = "") -> None:
        """F.

        Args:
            b: from the docstring
        """

    assert f.parameters["properties"] == {
        "a": {"type": "integer", "description": "how many"},
        "b": {"type": "string", "description": "from the docstring", "default": ""},
    }
    renamed = tool(name="g", timeout=1)(f)
    assert (renamed.name, renamed.timeout, renamed.parameters, f.name) == ("g", 1, f.parameters, "f")

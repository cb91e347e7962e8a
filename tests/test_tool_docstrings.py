"""@tool checks the docstring the model reads, at decoration (issue 32, item 7).

The rules (agentrl/toolbox/tool.py, module docstring): no description raises, an ``Args:``
entry that names no parameter raises, a parameter without a description warns.
"""

from __future__ import annotations

import warnings
from typing import Annotated

import pytest

from agentrl.toolbox import Tool, ToolBox, ToolContext, tool
from agentrl.toolbox.tool import ToolDocWarning


def test_no_docstring_raises_with_the_fix() -> None:
    def add(a: int, b: int) -> int:
        return a + b

    with pytest.raises(ValueError, match=r"tool 'add' \(test_tool_docstrings.py:\d+\) has no description") as err:
        tool(add)
    assert "docstring" in str(err.value) and "description=" in str(err.value)
    for build in (lambda: Tool(add), lambda: ToolBox([add]), lambda: tool(add, description="  ")):
        with pytest.raises(ValueError, match="has no description"):
            build()


def test_docstring_with_only_sections_has_no_description() -> None:
    def add(a: int) -> int:
        """Args:
        a: a number
        """
        return a

    with pytest.raises(ValueError, match="has no description"):
        tool(add)


def test_description_argument_stands_in_for_a_docstring() -> None:
    def add(a: Annotated[int, "first term"]) -> int:
        return a

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = tool(add, description="Add.")
    assert t.description == "Add." and t.parameters["properties"]["a"]["description"] == "first term"


def test_args_entry_naming_no_parameter_raises() -> None:
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first term
            c: second term
        """
        return a + b

    with pytest.raises(ValueError, match=r"`Args:` entry 'c' names no parameter of the function \(its parameters: a, b\)"):
        tool(add)


def test_misspelled_entries_get_a_suggestion() -> None:
    def search(query: str, top_k: int = 5) -> str:
        """Search.

        :param qurey: words to look for
        :param topk: how many
        """
        return query

    with pytest.raises(ValueError, match=r"entries 'qurey' \(did you mean 'query'\?\), 'topk' \(did you mean 'top_k'\?\) name no"):
        tool(search)


def test_undocumented_parameter_warns_at_the_decoration_line() -> None:
    with pytest.warns(ToolDocWarning, match=r"tool 'add' .*parameter\(s\) b; describe each in the docstring's `Args:`") as rec:
        @tool
        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: first term
            """
            return a + b

    assert rec[0].filename == __file__  # points at the user's code, not at agentrl/toolbox
    assert add.parameters["properties"]["a"]["description"] == "first term"
    assert "description" not in add.parameters["properties"]["b"]


def test_fully_documented_tools_are_silent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @tool
        def counter(step: int, label: Annotated[str, "a tag"] = "", ctx: ToolContext | None = None) -> int:
            """Count per trajectory.

            Args:
                step: increment
                ctx: injected; documenting it is allowed although the model never sees it
            """
            return step

        @tool
        def ping() -> str:
            """Answer pong."""
            return "pong"

    assert set(counter.parameters["properties"]) == {"step", "label"} and ping.description == "Answer pong."


def test_a_schema_given_by_hand_checks_only_the_description() -> None:
    def f(x: int) -> int:
        """F.

        Args:
            y: stale entry, irrelevant: the schema below is what the model sees
        """
        return x

    schema = {"type": "object", "properties": {"x": {"type": "integer", "description": "x"}}, "required": ["x"]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Tool(f, parameters=schema).parameters == schema
    def g(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="has no description"):
        Tool(g, parameters=schema)


def test_builtin_tools_follow_the_rules() -> None:
    from agentrl.tools import python_tool, search_tools

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tools = [python_tool(), python_tool(mode="stateful"), *search_tools("local")]
    assert all(t.description for t in tools)

"""Tool output as text, capped in tokens: head and tail kept, a note, fast on 1 MB."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agentrl.toolbox import ToolBox, ToolContext, cap_tokens, tool
from fixture_paths import QWEN25 as QWEN


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def qwen() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(QWEN))

def test_cap_by_characters_without_tokenizer() -> None:
    text = "HEAD" + "m" * 100_000 + "TAIL"
    out, cut = cap_tokens(text, None, 100)
    assert cut and len(out) <= 400
    assert out.startswith("HEAD") and out.endswith("TAIL") and "characters cut]" in out
    kept = len(out) - len(out[out.index("\n...[") : out.index("]...\n") + 5])
    assert f"[{len(text) - kept} characters cut]" in out
    assert cap_tokens("tiny", None, 1) == ("tiny", False)
    with pytest.raises(ValueError, match="at least 1"):
        cap_tokens("x", None, 0)


def test_cap_tokens_exact_count_with_real_tokenizer(qwen: Any) -> None:
    text = " ".join(f"word{i}" for i in range(600))
    ids = qwen.encode(text, add_special_tokens=False)
    assert cap_tokens(text, qwen, len(ids)) == (text, False)
    for budget in (300, 64):  # 300: whole text tokenized, exact count; 64: pre-cut, estimated count
        out, cut = cap_tokens(text, qwen, budget)
        assert cut
        head, rest = out.split("\n...[", 1)
        count, tail = rest.split(" tokens cut]...\n", 1)
        assert text.startswith(head) and text.endswith(tail) and head and tail
        kept = len(qwen.encode(head, add_special_tokens=False)) + len(qwen.encode(tail, add_special_tokens=False))
        if budget == 300:
            assert int(count) + kept == len(ids)
        else:
            assert count.startswith("~") and abs(int(count[1:]) + kept - len(ids)) < 0.1 * len(ids)
        assert len(qwen.encode(out, add_special_tokens=False)) <= budget + 2


def test_cap_tokens_keeps_multibyte_characters_whole(qwen: Any) -> None:
    text = "日本語のテキスト🙂" * 400
    out, cut = cap_tokens(text, qwen, 50)
    assert cut and "\ufffd" not in out
    head, tail = out.split("\n...[")[0], out.split("]...\n")[1]
    assert text.startswith(head) and text.endswith(tail)


def test_one_megabyte_output_capped_quickly(qwen: Any) -> None:
    seen_lengths: list[int] = []

    class Recording:
        """The real tokenizer, recording how much text each encode call receives."""

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            seen_lengths.append(len(text))
            return qwen.encode(text, add_special_tokens=add_special_tokens)

        def decode(self, ids: list[int]) -> str:
            return qwen.decode(ids)

    @tool
    def dump() -> str:
        """Print a lot."""
        return "BEGIN-OF-OUTPUT " + "".join(f"line {i}: value={i * i}\n" for i in range(50_000))[:1_000_000] + " END-OF-OUTPUT"

    box = ToolBox([dump], tokenizer=Recording(), max_output_tokens=256)
    r = run(box.execute("dump", {}, ToolContext("t")))
    assert r.error is None and r.truncated
    assert r.content.startswith("BEGIN-OF-OUTPUT line 0") and r.content.endswith(" END-OF-OUTPUT")
    assert "tokens cut]" in r.content and "[~" in r.content  # estimated: the middle was never tokenized
    assert max(seen_lengths) <= 256 * 16  # pre-cut by characters, never 1 MB at once
    assert len(qwen.encode(r.content, add_special_tokens=False)) <= 256 + 2
    print(f"1 MB capped to {len(r.content)} chars in {r.latency_s * 1000:.1f} ms")


def test_per_tool_output_budget_and_error_outputs_capped() -> None:
    @tool(max_output_tokens=10)
    def small() -> str:
        """Small budget."""
        return "y" * 1000

    @tool
    def big() -> str:
        """Box budget."""
        return "z" * 1000

    box = ToolBox([small, big], max_output_tokens=50)
    assert len(run(box.execute("small", {}, ToolContext("t"))).content) <= 40
    r = run(box.execute("big", {}, ToolContext("t")))
    assert r.truncated and 150 < len(r.content) <= 200

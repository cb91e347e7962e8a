"""Tool-integrated reasoning (ToRL, SimpleTIR, ReTool, ZeroTIR): code runs in the middle of a turn.

The model writes a fenced ``python`` block inside its answer; generation pauses when the
block closes, the code runs in the ``python`` tool, and its real output is appended as tool
tokens in a fenced ``output`` block. The same assistant turn then continues: no tool message,
no chat-template delta. Small instruct models write code this way unprompted (SmolLM2 writes
fenced blocks, never ``<tool_call>``)::

    Let me compute it.
    ```python
    print(17 * 23)
    ```
    ```output          <- appended by the rollout (mask 0, span "tool")
    391
    ```
    <answer>391</answer>

Rules (:class:`CodeBlockTurn`, the turn state the rollout asks at each pause, applies
:func:`at_stop` and :func:`observation`):

- Generation pauses on :data:`STOP_STRINGS`: the closing fence of a block (``"\\n```\\n"``) or
  the model opening an ``output`` block itself. The tokens sampled stay as sampled, even
  when the stop string ends inside a token (token-in-token-out).
- A closed ``python``/``py`` block not yet followed by an ``output`` block runs; any other
  closed block (```text ...```) is left alone and generation resumes.
- A model that opens its own ``output`` block with no code to run has invented a result: the
  attempt ends there (finish "stop", a void turn), so the only outputs a trajectory holds are
  real ones.
- A block that never closes never runs: the turn ends as the model ends it (its end-of-turn
  token, or the token budget).

>>> stop = at_stop("Compute.\\n```python\\nprint(17 * 23)\\n```\\n")
>>> stop.call.name, stop.call.arguments, repr(stop.written)
('python', {'code': 'print(17 * 23)'}, "'\\\\n'")
>>> observation(stop, "391\\n")
'```output\\n391\\n```\\n'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentrl.chat.formats.base import MidTurn, MidTurnState, ParsedTurn, Pause, ToolCallFormat, ToolSchemas
from agentrl.types import ToolCall

TOOL = "python"  # the tool that runs the blocks, argument ``code``
OUTPUT_OPEN = "```output"
STOP_STRINGS = ("\n```\n", OUTPUT_OPEN)
_CODE_OPEN = re.compile(r"```(?:python3?|py)[ \t]*\n", re.IGNORECASE)
_CLOSE = "\n```"


@dataclass(frozen=True)
class CodeStop:
    """What the turn so far asks for at a pause."""

    call: ToolCall | None  # the block to run now; None: nothing to run
    fabricated: bool = False  # the model opened an output block with no code before it
    written: str = ""  # what the model wrote after the block's closing fence (often "\n")


def at_stop(turn_text: str) -> CodeStop:
    """The call a turn's text (model and tool tokens since the turn began, decoded) ends with."""
    opens = list(_CODE_OPEN.finditer(turn_text))
    if opens:
        body_start = opens[-1].end()
        close = turn_text.find(_CLOSE, body_start - 1)
        if close >= 0:
            after = turn_text[close + len(_CLOSE):]
            if OUTPUT_OPEN not in after or _model_opened_output(after):
                code = turn_text[body_start:close] if close >= body_start else ""
                return CodeStop(ToolCall(TOOL, {"code": code}), written=after)
    if turn_text.rstrip().endswith(OUTPUT_OPEN) or turn_text.endswith(OUTPUT_OPEN + "\n"):
        return CodeStop(None, fabricated=True)
    return CodeStop(None)


def _model_opened_output(after: str) -> bool:
    """The model itself began the output block right after the closing fence (the pause came
    on ``OUTPUT_OPEN`` in the same token as the fence's newline): nothing follows the header."""
    head = after.find(OUTPUT_OPEN)
    return after[:head].strip() == "" and after[head + len(OUTPUT_OPEN):].strip() == ""


def observation(stop: CodeStop, output: str) -> str:
    """The text appended after a run: a fenced output block, less whatever prefix of it the
    model already wrote after the closing fence (a newline, or the ``output`` header)."""
    body = output if output.endswith("\n") or not output else output + "\n"
    block = f"\n{OUTPUT_OPEN}\n{body}```\n"
    if block.startswith(stop.written):
        return block[len(stop.written):]
    return ("" if stop.written.endswith("\n") else "\n") + block.lstrip("\n")


class CodeBlockTurn(MidTurnState):
    """A turn of this format: at a pause, the block to run (or an invented output, which ends
    the attempt); after the run, its output block. Keeps the pause's :class:`CodeStop`, whose
    ``written`` the output block completes."""

    stop: CodeStop | None = None

    def decide(self, turn_text: str) -> Pause:
        self.stop = at_stop(turn_text)
        return Pause(self.stop.call, end_attempt=self.stop.fabricated)

    def observation(self, output: str) -> str:
        return observation(self.stop, output)


def parse_code_block(text: str, tools: ToolSchemas = None) -> ParsedTurn:
    """A finished turn: its blocks already ran inside it, so it carries no calls."""
    return ParsedTurn(content=text.strip())


FORMAT = ToolCallFormat(
    name="code_block", parse=parse_code_block, families="SmolLM2, small instruct models; ToRL/SimpleTIR-style TIR",
    description="```python ... ``` inside the turn; the output block is appended and the turn continues",
    mid_turn=MidTurn(tool=TOOL, stop_strings=STOP_STRINGS, state=CodeBlockTurn,
                     tool_hint="the python tool (agentrl.tools.python_tool())"))

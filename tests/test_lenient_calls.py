"""Lenient tool-call reading (model.lenient_tool_calls): bare and fenced JSON calls naming an
offered tool are read in the JSON formats; everything else stays text; the sampled tokens are
trained exactly as sampled."""

from __future__ import annotations

import pytest

from agentrl.chat import ChatTemplate
from agentrl.chat.formats import FORMATS, get_format
from agentrl.chat.formats.lenient import LENIENT_FORMATS, lenient, lenient_calls
from agentrl.chat.template import TemplateError
from agentrl.types import ToolCall

TOOLS = [{"type": "function", "function": {"name": "multiply", "description": "a*b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "add", "parameters": {}}}]
CALL = '{"name": "multiply", "arguments": {"a": 6, "b": 7}}'
SIX_SEVEN = [ToolCall("multiply", {"a": 6, "b": 7})]


def _read(text: str, fmt: str = "hermes", tools=TOOLS):
    return lenient(get_format(fmt)).parse(text, tools)


# -- what is read -------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", LENIENT_FORMATS)
@pytest.mark.parametrize("text, content", [
    (CALL, ""),                                                            # the whole turn
    (f"I will multiply the numbers.\n{CALL}", "I will multiply the numbers."),  # prose, then the call
    (f"  {CALL}  \n", ""),                                                 # indented, trailing blanks
    (f"Let me call it:\n```json\n{CALL}\n```", "Let me call it:"),          # fenced json
    (f"```\n{CALL}\n```\nwaiting for the result", "waiting for the result"),  # unlabelled fence
    (f"```JSON\n{CALL.replace('arguments', 'parameters')}\n```", ""),      # Llama's "parameters"
    ('{"name": "multiply", "arguments": "{\\"a\\": 6, \\"b\\": 7}"}', ""),  # arguments as a JSON string
    ('{"type": "function", "name": "multiply", "arguments": {"a": 6, "b": 7}}', ""),
])
def test_bare_and_fenced_calls_are_read(fmt, text, content):
    turn = _read(text, fmt)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("multiply", {"a": 6, "b": 7})], turn
    assert turn.errors == [] and turn.content == content


def test_several_calls_in_order_and_a_list():
    text = f'First:\n{CALL}\nthen\n{{"name": "add", "arguments": {{}}}}'
    turn = _read(text)
    assert [c.name for c in turn.tool_calls] == ["multiply", "add"] and turn.content == "First:\n\nthen"
    listed = _read(f'[\n  {CALL},\n  {{"name": "add", "arguments": {{"x": 1}}}}\n]')
    assert [c.name for c in listed.tool_calls] == ["multiply", "add"] and listed.content == ""
    fenced = _read(f'```json\n[{CALL}, {CALL}]\n```')
    assert len(fenced.tool_calls) == 2


def test_a_call_shaped_object_with_bad_arguments_is_an_error_not_silence():
    turn = _read('{"name": "multiply", "arguments": "a=6"}')
    assert turn.tool_calls == [] and turn.errors == ['tool call 1: "arguments" is a string that is not JSON']


# -- what stays text ----------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    '{"name": "divide", "arguments": {"a": 6, "b": 7}}',                    # names no offered tool
    '```json\n{"name": "divide", "arguments": {}}\n```',
    f"The call would be {CALL} but I can do it myself: 42.",                # JSON inside prose
    f"Here: {CALL}",                                                        # not at a line start
    f"{CALL} is what I would send",                                         # text after it on its line
    '{"answer": 42}',                                                       # an answer object
    '<answer>{"name": "multiply", "arguments": {"a": 6, "b": 7}}</answer>',  # an answer holding JSON
    '{"name": "multiply", "result": 42}',                                   # names the tool, but a result
    '{"name": "multiply", "arguments": {"a": 6}, "result": 42}',            # a call plus a result key
    '{"name": "multiply"}',                                                 # no arguments member
    '["multiply", 6, 7]',                                                   # a list that is not calls
    f'[{CALL}, {{"answer": 42}}]',                                          # a list with a non-call
    '[\n {"answer": 1},\n {"name": "multiply", "arguments": {}}\n]',       # a non-call list's last item
    '```python\nprint({"name": "multiply", "arguments": {}})\n```',         # code, not JSON
    '```python\nx = 1\n{"name": "multiply", "arguments": {}}\n```',          # a line inside a code block
    '{"name": "multiply", "arguments": {"a": 6, "b": 7}',                   # cut off: invalid JSON
    "The answer is 42.",
    "",
])
def test_strict_negatives_stay_text(text):
    turn = _read(text)
    assert turn.tool_calls == [] and turn.errors == [], turn
    assert turn.content == text.strip()


def test_no_offered_tools_means_no_lenient_calls():
    assert _read(CALL, tools=None).tool_calls == [] and _read(CALL, tools=[]).tool_calls == []
    assert lenient_calls(CALL, None) is None


def test_a_turn_in_the_formats_own_syntax_is_read_strictly():
    wrapped = f"<tool_call>{CALL}</tool_call>\n{{\"name\": \"add\", \"arguments\": {{}}}}"
    turn = _read(wrapped)  # the hermes call counts; the bare line after it is not added
    assert [c.name for c in turn.tool_calls] == ["multiply"]
    broken = _read('<tool_call>{"name": "multiply", "arguments": </tool_call>\n' + CALL)
    assert broken.tool_calls == [] and broken.errors and broken.errors[0].startswith("tool call 1: invalid JSON")


def test_strict_is_unchanged_and_lenient_only_wraps_json_formats():
    assert get_format("hermes").parse(CALL, TOOLS).tool_calls == []  # the default reading
    assert get_format("hermes").parse(f"text\n```json\n{CALL}\n```", TOOLS).tool_calls == []
    assert set(LENIENT_FORMATS) <= set(FORMATS)
    for name in set(FORMATS) - set(LENIENT_FORMATS):
        with pytest.raises(ValueError, match="JSON formats"):
            lenient(get_format(name))
    wrapped = lenient(get_format("hermes"))
    assert wrapped.name == "hermes" and wrapped.call_openings == get_format("hermes").call_openings


def _tiny_tokenizer():
    from transformers import AutoTokenizer

    from agentrl.models.tiny import ensure_tiny_model

    return AutoTokenizer.from_pretrained(ensure_tiny_model())


def test_chat_template_option_default_off_and_checked():
    tok = _tiny_tokenizer()
    strict = ChatTemplate(tok, "hermes")
    assert strict.lenient_tool_calls is False and strict.parse_assistant(CALL, TOOLS).tool_calls == []
    loose = ChatTemplate(tok, "hermes", lenient_tool_calls=True)
    assert loose.parse_assistant(CALL + "<|im_end|>", TOOLS).tool_calls == SIX_SEVEN
    with pytest.raises(TemplateError, match="model.lenient_tool_calls=false"):
        ChatTemplate(tok, "hermes", tool_call_format="qwen_xml", lenient_tool_calls=True)


def test_config_key_reaches_the_runtime():
    from agentrl.envs.arithmetic import ArithmeticEnv
    from agentrl.run.build import build_runtime
    from agentrl.run.config import load_config

    assert load_config(None).model.lenient_tool_calls is False
    cfg = load_config(None, ["model.lenient_tool_calls=true"])
    env = ArithmeticEnv(num_train=4, num_test=2)
    from agentrl.models.tiny import ensure_tiny_model

    rt = build_runtime(cfg, env, str(ensure_tiny_model()))
    assert rt.chat.lenient_tool_calls is True
    assert rt.chat.parse_assistant('{"name": "python", "arguments": {"code": "print(1)"}}', rt.toolbox.schemas()).tool_calls


@pytest.mark.parametrize("lenient_on", [True, False])
def test_rollout_runs_the_bare_call_and_trains_the_sampled_ids(lenient_on):
    from agentrl.engines.scripted import ScriptedEngine
    from agentrl.rollout import RolloutConfig, RolloutRunner
    from agentrl.toolbox import ToolBox, tool
    from agentrl.types import Task

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: first factor
            b: second factor
        """
        return a * b

    tok = _tiny_tokenizer()
    chat = ChatTemplate(tok, "hermes", lenient_tool_calls=lenient_on)
    turns = [tok.encode(f"I will multiply.\n```json\n{CALL}\n```<|im_end|>", add_special_tokens=False),
             tok.encode("<answer>42</answer><|im_end|>", add_special_tokens=False)]
    box = ToolBox([multiply], tokenizer=tok)
    runner = RolloutRunner(ScriptedEngine(turns), chat, box, RolloutConfig(max_turns=3))
    (traj,) = runner.run([Task(id="q", prompt="6*7?", answer="42")], 1).trajectories
    traj.check()
    model_spans = [traj.token_ids[s.start:s.end] for s in traj.spans if s.kind == "model"]
    if not lenient_on:  # strict: no call, the turn is the answer attempt and the rollout ends
        assert [m.role for m in traj.messages][-1] == "assistant" and not traj.messages[-1].tool_calls
        assert model_spans == [turns[0]]
        return
    assert [m.role for m in traj.messages] == ["user", "assistant", "tool", "assistant"]
    assert traj.messages[1].tool_calls == SIX_SEVEN and traj.messages[1].content == "I will multiply."
    assert traj.messages[2].content == "42"
    # the trained tokens are exactly the sampled ones: the bare call was never re-rendered as <tool_call>
    assert model_spans == turns
    assert sum(traj.loss_mask) == len(turns[0]) + len(turns[1])

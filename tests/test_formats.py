"""The tool-call format registry: parsers on well-formed and malformed text, detection errors,
and how ChatTemplate uses a format (stop ids, schema-typed values)."""

from __future__ import annotations

import pytest
from jinja2 import Template

from agentrl.chat import ChatTemplate, TemplateError
from agentrl.chat.formats import FORMATS, TEMPLATE_FORMATS, FormatDetectionError, detect_format, get_format
from agentrl.types import ToolCall
from fixture_paths import QWEN25

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
    "q": {"type": "string"}, "n": {"type": "integer"}, "ok": {"type": "boolean"}}}}}]


def _calls(name: str, text: str, tools=None):
    turn = FORMATS[name].parse(text, tools)
    return [(c.name, c.arguments) for c in turn.tool_calls], turn.errors, turn.content


# (format, sampled text with two calls and some prose) -> both calls read back, prose kept
GOOD = {
    "hermes": 'Let me.\n<tool_call>{"name": "f", "arguments": {"q": "a"}}</tool_call><tool_call>{"name": "g", '
              '"arguments": {}}</tool_call>',
    "qwen_xml": "Let me.\n<tool_call>\n<function=f>\n<parameter=q>\na\n</parameter>\n</function>\n</tool_call>\n"
                "<tool_call>\n<function=g>\n</function>\n</tool_call>",
    "glm4": "Let me.\n<tool_call>f\n<arg_key>q</arg_key>\n<arg_value>a</arg_value>\n</tool_call><tool_call>g\n"
            "</tool_call>",
    "harmony": 'Let me.<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"q": "a"}<|call|>'
               '<|start|>assistant<|channel|>commentary to=functions.g <|constrain|>json<|message|>{}<|call|>',
    "gemma4": 'Let me.<|tool_call>call:f{q:<|"|>a<|"|>}<tool_call|><|tool_call>call:g{}<tool_call|>',
    "deepseek_v3": "Let me.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"q\": \"a\"}\n"
                   "```<｜tool▁call▁end｜><｜tool▁call▁begin｜>g<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "mistral": 'Let me.[TOOL_CALLS][{"name": "f", "arguments": {"q": "a"}}, {"name": "g", "arguments": {}}]',
    "pythonic": "Let me.<|tool_call_start|>[f(q='a'), g()]<|tool_call_end|>",
    "atem_xml": 'Let me.<atem:function_calls>\n<atem:invoke name="f">\n<atem:parameter name="q">a</atem:parameter>\n'
                '</atem:invoke>\n<atem:invoke name="g">\n</atem:invoke>\n</atem:function_calls>',
}
# (format, text with one broken call then one good call): the error is an observation, the good call kept
BROKEN = {
    "hermes": ('<tool_call>{"name": "f", "arguments": {"q": </tool_call>', "invalid JSON"),
    "qwen_xml": ("<tool_call>\n<parameter=q>\na\n</parameter>\n</tool_call>", "expected <function=NAME>"),
    "glm4": ("<tool_call>f\n<arg_key>q</arg_key>\noops</tool_call>", "text outside"),
    "harmony": ('<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{"q": <|call|>', "invalid JSON"),
    "gemma4": ("<|tool_call>call:f{q:bare words}<tool_call|>", "bare word"),
    "deepseek_v3": ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"q\":\n```"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "invalid JSON"),
    "mistral": ('[TOOL_CALLS][{"name": "f", "arguments": {"q": }]', "invalid JSON"),
    "pythonic": ("<|tool_call_start|>[f(q=)]<|tool_call_end|>", "not a Python call list"),
    "atem_xml": ('<atem:function_calls><atem:invoke name="f">junk</atem:invoke></atem:function_calls>', "text outside"),
}


def test_every_format_is_tested():
    # code_block runs its calls inside the turn: tests/test_code_block.py covers it
    assert set(GOOD) | {"llama3_json"} == set(TEMPLATE_FORMATS) == set(BROKEN) | {"llama3_json"}
    assert set(FORMATS) - set(TEMPLATE_FORMATS) == {"code_block"}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_parse_two_calls_and_prose(name):
    calls, errors, content = _calls(name, GOOD[name])
    assert calls == [("f", {"q": "a"}), ("g", {})] and not errors
    assert content.startswith("Let me.")


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_malformed_call_is_an_error_not_silence(name):
    text, message = BROKEN[name]
    calls, errors, _ = _calls(name, text)
    assert not calls and len(errors) == 1 and message in errors[0], errors


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_plain_answer_has_no_calls_and_no_errors(name):
    assert _calls(name, "The answer is <answer>42</answer>.") == ([], [], "The answer is <answer>42</answer>.")


@pytest.mark.parametrize("name", ["qwen_xml", "glm4", "atem_xml"])
def test_bare_values_are_typed_by_the_schema(name):
    text = {"qwen_xml": "<tool_call>\n<function=f>\n<parameter=q>\n391\n</parameter>\n<parameter=n>\n391\n</parameter>"
                        "\n<parameter=ok>\nTrue\n</parameter>\n</function>\n</tool_call>",
            "glm4": "<tool_call>f\n<arg_key>q</arg_key>\n<arg_value>391</arg_value>\n<arg_key>n</arg_key>\n"
                    "<arg_value>391</arg_value>\n<arg_key>ok</arg_key>\n<arg_value>true</arg_value>\n</tool_call>",
            "atem_xml": '<atem:function_calls><atem:invoke name="f"><atem:parameter name="q">391</atem:parameter>'
                        '<atem:parameter name="n">391</atem:parameter><atem:parameter name="ok">true'
                        '</atem:parameter></atem:invoke></atem:function_calls>'}[name]
    assert _calls(name, text, TOOLS)[0] == [("f", {"q": "391", "n": 391, "ok": True})]
    assert _calls(name, text)[0][0][1]["q"] == 391  # without the schema, JSON-looking text is JSON


def test_unclosed_final_block_is_read_when_complete():
    assert _calls("qwen_xml", "<tool_call>\n<function=f>\n<parameter=q>\na\n</parameter>\n</function>\n")[0] == \
        [("f", {"q": "a"})]
    assert _calls("gemma4", '<|tool_call>call:f{q:<|"|>a<|"|>}')[0] == [("f", {"q": "a"})]


def test_get_format_unknown_names_the_choices():
    with pytest.raises(FormatDetectionError, match="hermes") as err:
        get_format("chatml")
    assert "qwen_xml" in str(err.value)


def _renderer(source: str):
    tmpl = Template(source)
    return lambda messages, tools, gen: tmpl.render(messages=messages, tools=tools, add_generation_prompt=gen)


CALLS_AS = "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}CALL{% endfor %}<|im_end|>{% endfor %}"


def test_detection_that_is_not_sure_raises_with_candidates():
    both = CALLS_AS.replace("CALL", "<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson "
                                    "}}</tool_call>[TOOL_CALLS][{{ {'name': c.function.name, 'arguments': "
                                    "c.function.arguments} | tojson }}]")
    with pytest.raises(FormatDetectionError, match="several formats") as err:
        detect_format(_renderer(both))
    assert err.value.candidates == ["hermes", "mistral"] and "tool_call_format=" in str(err.value)


def test_detection_reads_the_rendering_not_the_source():
    # mentions <tool_call> and "parameters" (the old substring tests) but writes Gemma 4 calls
    source = ("{# reply with <tool_call> JSON holding \"parameters\" #}" + CALLS_AS.replace(
        "CALL", "<|tool_call>call:{{ c.function.name }}{city:<|\"|>{{ c.function.arguments.city }}<|\"|>,"
                "days:{{ c.function.arguments.days }}}<tool_call|>"))
    assert detect_format(_renderer(source)) == "gemma4"
    unknown = CALLS_AS.replace("CALL", "CALL {{ c.function.name }} {{ c.function.arguments | tojson }}")
    with pytest.raises(FormatDetectionError, match="no registered format reads"):
        detect_format(_renderer(unknown))
    with pytest.raises(FormatDetectionError, match="does not render the assistant's tool calls"):
        detect_format(_renderer(CALLS_AS.replace("CALL", "")))


def test_chat_template_adds_the_format_stop_token():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(QWEN25)
    tok.add_special_tokens({"additional_special_tokens": ["<|call|>"]})
    harmony = ChatTemplate(tok, "hermes", tool_call_format="harmony")
    call_id = tok.convert_tokens_to_ids("<|call|>")
    assert harmony.stop_token_ids == [151645, call_id]
    assert ChatTemplate(tok, "hermes").stop_token_ids == [151645]  # hermes declares none
    turn = harmony.parse_assistant(' to=functions.f<|channel|>commentary json<|message|>{"q": "a"}<|call|>')
    assert turn.tool_calls == [ToolCall("f", {"q": "a"})] and not turn.errors
    with pytest.raises(TemplateError, match="unknown tool_call_format 'xml'"):
        ChatTemplate(tok, "hermes", tool_call_format="xml")

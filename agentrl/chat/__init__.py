"""Chat: how a conversation becomes token ids and how sampled text becomes tool calls.

- ``template.py``: :class:`ChatTemplate`, the prompt ids and the ids to append after each
  sampled turn (token-in-token-out: the template's rendering delta, tool output encoded as
  literal text);
- ``check.py``: the prefix-preservation check (``agentrl check-template``) and the corpus report;
- ``formats/``: one module per tool-call syntax (hermes, qwen_xml, harmony, code_block...),
  the registry, and detection of a template's format by rendering.

The chat templates themselves live in the top-level ``templates/`` folder, installed as
``agentrl.templates``.
"""

from agentrl.chat.template import (ChatTemplate, Segment, TemplateError, encode_literal, parse_hermes,
                                   parse_llama3_json, template_renderer)

__all__ = ["ChatTemplate", "Segment", "TemplateError", "encode_literal", "parse_hermes", "parse_llama3_json",
           "template_renderer"]

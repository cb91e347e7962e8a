"""Every tool-call format against the 72 real chat templates TRL ships (trl/chat_templates).

The templates are read from the installed ``trl`` package (a test-only dependency of the
``dev`` extra), never copied here. Each is rendered with the Qwen2.5 fixture tokenizer: only
text is compared, the tokenizer merely supplies eos/pad strings (bos is set to "" because
Qwen2.5 has none and Llama templates print it).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from agentrl.chat import template_renderer
from agentrl.chat.formats import FormatDetectionError, detect_format
from agentrl.chat.formats.roundtrip import ROUND_TRIP_CASES, round_trip
from fixture_paths import QWEN25

_SPEC = importlib.util.find_spec("trl")  # found without importing trl (which imports half of HF)
CORPUS = Path(_SPEC.submodule_search_locations[0]) / "chat_templates" if _SPEC else None
pytestmark = pytest.mark.skipif(CORPUS is None, reason="trl is not installed: `pip install -e .[dev]` (or `make "
                                "test`) installs it; its chat_templates/ folder is the corpus these tests read")

# Recorded with trl 1.16.0: the format each template writes, or None where it renders no
# assistant tool calls at all (no tool support, or VLM templates that need list contents).
_BY_FORMAT = {
    "hermes": "qwen2_5 qwen2_5_training qwen3 qwen3_training qwen3_instruct_2507 qwen3_instruct_2507_training "
              "qwen3_vl qwen3_vl_training",
    "llama3_json": "llama3_1 llama3_2",
    "qwen_xml": "qwen3_5_nothink qwen3_5_nothink_training qwen3_5_think qwen3_5_think_training qwen3_6 "
                "qwen3_6_training qwen3_8 qwen3_8_training nemotron_3_5_lightning nemotron_3_5_lightning_training "
                "nemotron_3_nano nemotron_3_nano_training nemotron_3_super nemotron_3_super_training "
                "nemotron_3_ultra nemotron_3_ultra_training",
    "glm4": "glm4moe glm4moe_training",
    "harmony": "gptoss gptoss_training",
    "gemma4": "gemma4 gemma4_v2 gemma4_v3 gemma4_v4 gemma4_v5 diffusion_gemma diffusion_gemma_training",
    "deepseek_v3": "deepseekv3 deepseekv3_training",
    "pythonic": "lfm2_2_5 lfm2_2_5_v2 lfm2_2_5_vl lfm2_v2 lfm2_v2_training",
    "atem_xml": "muse_glimmer muse_glimmer_training",
    None: "cohere cohere_training cohere2 cohere2_training deepseek_r1_distill deepseek_r1_distill_training gemma "
          "gemma_training gemma3 gemma3_training lfm2 lfm2_training llama3 llama3_training phi3 phi3_training phi3_5 "
          "phi3_5_training qwen2_5_vl qwen2_5_vl_training idefics3 idefics3_training llava_next llava_next_training "
          "smolvlm smolvlm_training",
}
EXPECTED = {f"{name}.jinja": fmt for fmt, names in _BY_FORMAT.items() for name in names.split()}
WITH_CALLS = sorted(name for name, fmt in EXPECTED.items() if fmt)
# Templates that cannot hold two calls in one assistant turn: Llama 3.1/3.2 raise, gpt-oss
# renders tool_calls[0] only (Harmony writes one call per message).
NO_PARALLEL = {"llama3_1.jinja": "only supports single tool-calls", "llama3_2.jinja": "only supports single tool-calls",
               "gptoss.jinja": "renders only the first 1 of 2", "gptoss_training.jinja": "renders only the first 1 of 2"}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(QWEN25)


def _render(tokenizer, name: str):
    return template_renderer(tokenizer, (CORPUS / name).read_text(encoding="utf-8"), bos_token="")


def test_corpus_is_the_recorded_one():
    assert sorted(p.name for p in CORPUS.glob("*.jinja")) == sorted(EXPECTED)
    assert len(EXPECTED) == 72 and len(WITH_CALLS) == 46


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detection(tokenizer, name):
    want = EXPECTED[name]
    if want is None:
        with pytest.raises(FormatDetectionError, match="tool_call_format=") as err:
            detect_format(_render(tokenizer, name))
        assert "does not render the assistant's tool calls" in str(err.value) or "cannot render" in str(err.value)
    else:
        assert detect_format(_render(tokenizer, name)) == want


@pytest.mark.parametrize("case", list(ROUND_TRIP_CASES))
@pytest.mark.parametrize("name", WITH_CALLS)
def test_round_trip(tokenizer, name, case):
    result = round_trip(_render(tokenizer, name), EXPECTED[name], case)
    if case == "two parallel calls" and name in NO_PARALLEL:
        assert not result.rendered and NO_PARALLEL[name] in result.detail
    else:
        assert result.rendered and result.passed, result.detail

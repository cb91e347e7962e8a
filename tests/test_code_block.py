"""The ``code_block`` tool-call format (tool-integrated reasoning): fenced python blocks run in
the middle of an assistant turn, their real output is appended as tool tokens, and the same
turn continues. Scripted on the real Qwen2.5 tokenizer (exact ids, spans, masks; a stop
string that ends inside a token), then sampled on the tiny model taught one TIR answer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.chat import ChatTemplate
from agentrl.engines.hf import HFEngine
from agentrl.engines.scripted import PerRequestScriptedEngine, ScriptedEngine
from agentrl.env import final_answer
from agentrl.chat.formats import detect_format
from agentrl.chat.formats.base import MidTurn, MidTurnState, ParsedTurn, Pause, ToolCallFormat
from agentrl.chat.formats.code_block import at_stop, observation
from agentrl.models.tiny import ensure_tiny_model
from agentrl.rollout import RolloutConfig, RolloutRunner
from agentrl.toolbox import ToolBox, tool
from agentrl.tools.python import python_tool
from agentrl.types import Task, ToolCall

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fixture_paths import QWEN25, TEMPLATES  # noqa: E402

CALL = "Let me compute.\n```python\nprint(17 * 23)\n```\n"
OUTPUT = "```output\n391\n```\n"


# -- the format's two pure functions -------------------------------------------------------

def test_at_stop_runs_only_a_closed_python_block_not_yet_run():
    stop = at_stop(CALL)
    assert stop.call.arguments == {"code": "print(17 * 23)"} and stop.written == "\n" and not stop.fabricated
    assert at_stop("x\n```Python\n\n```\n").call.arguments == {"code": "\n"[:0]}  # an empty block runs too
    assert at_stop("See:\n```text\nhello\n```\n").call is None  # not code: the turn resumes
    ran = CALL + OUTPUT + "So:\n```text\nhi\n```\n"
    assert at_stop(ran).call is None and not at_stop(ran).fabricated  # its block already ran
    assert at_stop("```python\nprint(1)\n").call is None  # not closed yet
    # the model opened the output block in the token that ended the fence: run, keep its header
    opened = at_stop("```python\nprint(2)\n```\n```output")
    assert opened.call.arguments == {"code": "print(2)"} and opened.written == "\n```output"
    # an output block with no code before it is an invented result
    assert at_stop("The result is\n```output").fabricated
    assert at_stop(CALL + OUTPUT + "and\n```output\n").fabricated


@pytest.mark.parametrize("written, appended", [
    ("\n", "```output\n391\n```\n"),
    ("\n```output", "\n391\n```\n"),  # the header is the model's, the body is ours
    ("\n\n", "```output\n391\n```\n"),  # a token "`\\n\\n" ran past the fence
    ("", "\n```output\n391\n```\n"),
    (" x", "\n```output\n391\n```\n"),
])
def test_the_output_block_completes_what_the_model_wrote(written, appended):
    stop = at_stop("```python\nprint(391)\n```" + written)
    assert stop.call is not None and stop.written == written
    assert observation(stop, "391\n") == appended
    assert observation(stop, "391") == appended  # a missing final newline is added


def test_detection_never_picks_a_mid_turn_format():
    tmpl = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    tok = AutoTokenizer.from_pretrained(QWEN25)
    assert detect_format(lambda m, t, g: tok.apply_chat_template(
        m, tools=t, add_generation_prompt=g, tokenize=False, chat_template=tmpl)) == "hermes"


# -- scripted rollouts on the Qwen2.5 tokenizer ---------------------------------------------

@pytest.fixture(scope="module")
def qwen():
    tok = AutoTokenizer.from_pretrained(QWEN25)
    chat = ChatTemplate(tok, template=str(TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"), tool_call_format="code_block")
    return tok, chat, ToolBox([python_tool(timeout=10)], tokenizer=tok)


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def run(engine, chat, box, loop: str, max_turns: int = 4, **kw):
    runner = RolloutRunner(engine, chat, box, RolloutConfig(max_turns=max_turns, max_new_tokens=200, loop=loop, **kw))
    return runner.run([Task(id="t", prompt="What is 17*23?", answer="391")], num_samples=1).trajectories[0]


def engine_for(loop: str, script, tok):
    cls = PerRequestScriptedEngine if loop == "attempt" else ScriptedEngine
    return cls(script, tokenizer=tok)


@pytest.mark.parametrize("loop", ["attempt", "lockstep"])
def test_a_block_runs_mid_turn_and_the_turn_continues(qwen, loop):
    tok, chat, box = qwen
    end = chat.stop_token_ids[0]
    invented = enc(tok, CALL + "```output\n999\n```\n<answer>999</answer>") + [end]
    after = enc(tok, "<answer>391</answer>") + [end]
    traj = run(engine_for(loop, [invented, after], tok), chat, box, loop)
    traj.check()
    cut = enc(tok, CALL)  # the engine stopped where the fence closed: "``", "`\n"
    assert tok.decode(cut[-2:]) == "```\n"
    out_ids = enc(tok, OUTPUT)
    p = traj.prompt_len
    assert traj.token_ids[p:] == cut + out_ids + after
    assert [(s.kind, s.end - s.start) for s in traj.spans[1:]] == [("model", len(cut)), ("tool", len(out_ids)),
                                                                     ("model", len(after))]
    assert traj.loss_mask[p:] == [1] * len(cut) + [0] * len(out_ids) + [1] * len(after)
    assert traj.logprobs[p + len(cut):p + len(cut) + len(out_ids)] == [0.0] * len(out_ids)
    assert "999" not in tok.decode(traj.token_ids[p:])  # the invented output never entered
    assert [(r.name, r.arguments, r.result) for r in traj.tool_calls] == [("python", {"code": "print(17 * 23)"},
                                                                          "391\n")]
    # one assistant message for the whole turn: the model's own text, outputs left out
    assistant = [m for m in traj.messages if m.role == "assistant"]
    assert len(assistant) == 1 and assistant[0].content == (CALL + "<answer>391</answer>").strip()
    assert final_answer(traj.messages) == "391" and traj.finish_reason == "stop" and traj.void_turns == 0


def test_a_stop_string_ending_inside_a_token_keeps_the_sampled_token(qwen):
    tok, chat, box = qwen
    end = chat.stop_token_ids[0]
    first = enc(tok, "```python\nx = 6 * 7\nprint(x)\n```\n\nThe")  # "`\n\n" holds the fence's end and more
    assert tok.decode(first[-2]) == "`\n\n"
    after = enc(tok, "<answer>42</answer>") + [end]
    traj = run(engine_for("attempt", [first, after], tok), chat, box, "attempt")
    p = traj.prompt_len
    kept = first[:-1]  # sampled ids up to and with the token the stop ended in, none re-encoded
    out_ids = enc(tok, "```output\n42\n```\n")  # the model's "\n\n" already closed the line
    assert traj.token_ids[p:] == kept + out_ids + after
    assert [s.kind for s in traj.spans[1:]] == ["model", "tool", "model"]


def test_an_invented_output_block_ends_the_attempt(qwen):
    tok, chat, box = qwen
    end = chat.stop_token_ids[0]
    script = [enc(tok, "It is\n```output\n391\n```\n<answer>391</answer>") + [end]]
    traj = run(engine_for("attempt", script, tok), chat, box, "attempt")
    text = tok.decode(traj.token_ids[traj.prompt_len:])
    assert text.endswith("```output") and "391" not in text
    assert traj.tool_calls == [] and traj.finish_reason == "stop" and traj.void_turns == 1
    assert final_answer(traj.messages) is None


def test_an_unclosed_block_never_runs_and_other_blocks_resume(qwen):
    tok, chat, box = qwen
    end = chat.stop_token_ids[0]
    unclosed = run(engine_for("attempt", [enc(tok, "```python\nprint(1)") + [end]], tok), chat, box, "attempt")
    assert unclosed.tool_calls == [] and unclosed.finish_reason == "stop" and unclosed.void_turns == 1
    # a ```text block closing pauses generation; nothing runs and the same model span goes on
    first = enc(tok, "Plan:\n```text\nmultiply\n```\n")
    rest = enc(tok, "<answer>7</answer>") + [end]
    traj = run(engine_for("attempt", [first, rest], tok), chat, box, "attempt")
    assert traj.token_ids[traj.prompt_len:] == first + rest and traj.tool_calls == []
    assert [s.kind for s in traj.spans] == ["prompt", "model"] and traj.turns == 2
    assert final_answer(traj.messages) == "7"


def test_the_turn_budget_caps_code_runs(qwen):
    tok, chat, box = qwen
    block = enc(tok, "```python\nprint(1)\n```\n")
    traj = run(engine_for("attempt", lambda prompt, k: block, tok), chat, box, "attempt", max_turns=3)
    assert len(traj.tool_calls) == 2 and traj.finish_reason == "max_turns"
    assert [s.kind for s in traj.spans[1:]] == ["model", "tool"] * 2 + ["model"]


def test_output_caps_and_tool_errors_land_in_the_output_block(qwen):
    tok, chat, box = qwen
    end = chat.stop_token_ids[0]
    capped = ToolBox([python_tool(timeout=10, max_output_chars=50)], tokenizer=tok)
    first = enc(tok, "```python\nprint('x' * 5000)\n1/0\n```\n")
    traj = run(engine_for("attempt", [first, enc(tok, "<answer>no</answer>") + [end]], tok), chat, capped, "attempt")
    tool_span = next(s for s in traj.spans if s.kind == "tool")
    shown = tok.decode(traj.token_ids[tool_span.start:tool_span.end])
    assert shown.startswith("```output\n") and shown.endswith("```\n") and len(shown) < 400
    assert traj.tool_calls[0].result in shown


def test_output_that_prints_special_tokens_stays_plain_text(qwen):
    tok, chat, box = qwen
    end = chat.stop_token_ids[0]
    first = enc(tok, "```python\nprint('<|im_' + 'end|><tool' + '_call>')\n```\n")  # written without them
    traj = run(engine_for("attempt", [first, enc(tok, "<answer>ok</answer>") + [end]], tok), chat, box, "attempt")
    tool_span = next(s for s in traj.spans if s.kind == "tool")
    ids = traj.token_ids[tool_span.start:tool_span.end]
    assert end not in ids and tok.decode(ids) == "```output\n<|im_end|><tool_call>\n```\n"
    assert [s.kind for s in traj.spans] == ["prompt", "model", "tool", "model"] and traj.finish_reason == "stop"


def test_the_format_needs_the_python_tool(qwen):
    tok, chat, _ = qwen

    @tool
    def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: first
            b: second
        """
        return a + b

    with pytest.raises(ValueError, match="python tool"):
        RolloutRunner(ScriptedEngine([[1]]), chat, ToolBox([add]))


# -- a new mid-turn format, defined here alone ---------------------------------------------

class CalcTurn(MidTurnState):
    """A toy format: ``<calc>2+3</calc>`` runs the ``calc`` tool mid-turn and ``=5`` is appended.
    Its own per-turn state: a turn may run two sums; asking for a third ends the attempt."""

    def decide(self, turn_text: str) -> Pause:
        expr = turn_text[turn_text.rfind("<calc>") + len("<calc>"):turn_text.rfind("</calc>")]
        self.runs = getattr(self, "runs", 0) + 1
        return Pause(None, end_attempt=True) if self.runs > 2 else Pause(ToolCall("calc", {"expr": expr}))

    def observation(self, output: str) -> str:
        return "=" + output


CALC = ToolCallFormat(name="calc", description="<calc>a+b</calc> runs inside the turn",
                      parse=lambda text, tools=None: ParsedTurn(content=text.strip()),
                      mid_turn=MidTurn(tool="calc", stop_strings=("</calc>",), state=CalcTurn))


@tool
def calc(expr: str) -> int:
    """Sum integers.

    Args:
        expr: integers joined by +
    """
    return sum(int(x) for x in expr.split("+"))


@pytest.mark.parametrize("loop", ["attempt", "lockstep"])
def test_a_mid_turn_format_defined_in_one_file_runs_in_the_rollout(loop):
    tok = AutoTokenizer.from_pretrained(QWEN25)
    chat = ChatTemplate(tok, template=str(TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja"), tool_call_format="code_block")
    chat.format, chat.tool_call_format = CALC, "calc"  # registering it is one line in agentrl/chat/formats/__init__.py
    end = chat.stop_token_ids[0]
    turns = [enc(tok, "Sum <calc>2+3</calc>"), enc(tok, " and <calc>4+4</calc>"), enc(tok, " so <answer>13</answer>") + [end]]
    box = ToolBox([calc], tokenizer=tok)
    traj = run(engine_for(loop, turns, tok), chat, box, loop)
    traj.check()
    assert [s.kind for s in traj.spans] == ["prompt", "model", "tool", "model", "tool", "model"]
    assert [tok.decode(traj.token_ids[s.start:s.end]) for s in traj.spans if s.kind == "tool"] == ["=5", "=8"]
    assert [(r.name, r.arguments, r.result) for r in traj.tool_calls] == [("calc", {"expr": "2+3"}, "5"),
                                                                          ("calc", {"expr": "4+4"}, "8")]
    (msg,) = [m for m in traj.messages if m.role == "assistant"]
    assert msg.content == "Sum <calc>2+3</calc> and <calc>4+4</calc> so <answer>13</answer>"
    assert [c.arguments for c in msg.tool_calls] == [{"expr": "2+3"}, {"expr": "4+4"}]
    assert traj.finish_reason == "stop" and traj.void_turns == 0 and final_answer(traj.messages) == "13"
    # the state is the turn's own: a third sum in the same turn ends the attempt as a void turn
    third = run(engine_for(loop, [*turns[:2], enc(tok, " <calc>1+1</calc>")], tok), chat, box, loop)
    assert len(third.tool_calls) == 2 and third.finish_reason == "stop" and third.void_turns == 1


# -- sampled on the tiny model -------------------------------------------------------------

TAUGHT = "Let me compute.\n```python\nprint(17 * 23)\n```\n```output\n999\n```\n<answer>999</answer>"


@pytest.fixture(scope="module")
def taught(tmp_path_factory) -> Path:
    """The tiny model fine-tuned until it writes TAUGHT, invented output included."""
    base = ensure_tiny_model()
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    chat = ChatTemplate(tok, tool_call_format="code_block")
    from agentrl.types import Message
    prompt = chat.encode_prompt([Message("user", "What is 17*23?")], None)
    target = enc(tok, TAUGHT) + [chat.stop_token_ids[0]]
    ids = torch.tensor([prompt + target])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.manual_seed(0)
    for _ in range(800):
        logits = model(ids).logits[0, len(prompt) - 1:-1]
        loss = torch.nn.functional.cross_entropy(logits, ids[0, len(prompt):])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.0005:
            break
    out = tmp_path_factory.mktemp("taught")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("loop", ["attempt", "lockstep"])
def test_sampled_tir_on_the_tiny_model(taught, loop):
    engine = HFEngine.from_pretrained(str(taught), seed=0)
    chat = ChatTemplate(engine.tokenizer, tool_call_format="code_block")
    box = ToolBox([python_tool(timeout=10)], tokenizer=engine.tokenizer)
    runner = RolloutRunner(engine, chat, box, RolloutConfig(max_turns=3, max_new_tokens=64, temperature=0.0, loop=loop))
    batch = runner.run([Task(id="t", prompt="What is 17*23?", answer="391")], num_samples=3, seed=1)
    tok = engine.tokenizer
    for traj in batch.trajectories:
        traj.check()
        kinds = [s.kind for s in traj.spans]
        assert kinds[:4] == ["prompt", "model", "tool", "model"], kinds
        tool_span = traj.spans[2]
        assert tok.decode(traj.token_ids[tool_span.start:tool_span.end]) == OUTPUT
        assert traj.tool_calls[0].result == "391\n"
        text = tok.decode(traj.token_ids[traj.prompt_len:])
        assert "```output\n999" not in text  # stopped before the invented output
        # the recorded sampler log-probs are the model's own on the final sequence
        with torch.no_grad():
            logits = engine.model(torch.tensor([traj.token_ids])).logits[0].float()  # greedy: T=1 log-probs
        lp = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(traj.token_ids[1:])[:, None])[:, 0]
        for i, m in enumerate(traj.loss_mask):
            if m:
                assert abs(lp[i - 1].item() - traj.logprobs[i]) < 1e-3

"""Context compaction (agentrl/rollout/compaction.py, docs/compaction.md): the segments of a
compacted attempt tile its tokens with the right masks and spans, share one verdict and one
advantage and count once in their group; both loops; the failures that end an attempt; and
compaction off (or never triggered) leaves the rollout exactly as it was."""

from __future__ import annotations

import re

import pytest
from agentrl import ChatTemplate, RolloutConfig, RolloutRunner, Task, ToolBox, tool
from agentrl.algo.objective import Objective
from agentrl.algo.update import compute_advantages
from agentrl.engines.scripted import PerRequestScriptedEngine, ScriptedEngine
from agentrl.env import Score, final_answer
from agentrl.rollout.compaction import DEFAULT_COMPACTION_PROMPT, SUMMARY_HEADER, resume_messages
from agentrl.run.scoring import score_all
from agentrl.types import ConfigError, Message, Span, ToolCall, Trajectory, read_jsonl, write_jsonl
from tests.fixture_paths import QWEN25

PAGES = 4
BUDGET = 440  # holds three pages with room for the summary (this tokenizer, this prompt)
TASK = Task(id="q", prompt="Add up pages 1-4 of the ledger.", answer=str(sum(10 * n for n in range(1, PAGES + 1))))
CALL = '<tool_call>\n{{"name": "page", "arguments": {{"n": {n}}}}}\n</tool_call><|im_end|>'


@tool
def page(n: int) -> str:
    """Read one page of the ledger.

    Args:
        n: the page number
    """
    return f"PAGE {n}: " + "filler " * 30 + f"amount {n * 10}"


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(QWEN25)


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def ledger_script(tok, summary_suffix: str = "<|im_end|>"):
    """A policy that reads pages in order and remembers them only through what its context
    shows: the pages it sees, or a summary's "through page k". Asked for a summary, it
    writes one (ending with ``summary_suffix``)."""
    def script(prompt: list[int], _call: int) -> list[int]:
        text = tok.decode(prompt)
        if DEFAULT_COMPACTION_PROMPT in text[-300:]:
            last = max(map(int, re.findall(r"PAGE (\d+):", text)))
            return ids(tok, f"through page {last}{summary_suffix}")
        seen = [int(n) for pair in re.findall(r"PAGE (\d+):|through page (\d+)", text) for n in pair if n]
        nxt = max(seen, default=0) + 1
        if nxt > PAGES:
            return ids(tok, f"<answer>{TASK.answer}</answer><|im_end|>")
        return ids(tok, CALL.format(n=nxt))
    return script


def run(tok, mode: str, budget: int | None, loop: str = "attempt", samples: int = 2, script=None, **cfg):
    chat = ChatTemplate(tok, "hermes")
    engine = (PerRequestScriptedEngine if loop == "attempt" else ScriptedEngine)(script or ledger_script(tok))
    box = ToolBox([page], tokenizer=tok, max_output_tokens=64)
    config = RolloutConfig(max_turns=8, max_new_tokens=40, compaction=mode, context_budget=budget, loop=loop, **cfg)
    runner = RolloutRunner(engine, chat, box, config)
    return runner.run([TASK], samples, system_prompt="Be brief.").trajectories, chat


def segments_of(trajs: list[Trajectory], sample: int) -> list[Trajectory]:
    return [t for t in trajs if t.sample_index == sample]


def decoded(tok, t: Trajectory, kind: str) -> list[str]:
    return [tok.decode(t.token_ids[s.start:s.end]) for s in t.spans if s.kind == kind]


class Ledger:
    def score(self, task, messages):
        return Score(float(final_answer(messages) == task.answer))


@pytest.mark.parametrize("loop", ["attempt", "lockstep"])
def test_summarized_attempt_tiles_its_segments(tok, loop):
    trajs, chat = run(tok, "summarize", BUDGET, loop)
    first, second = segments_of(trajs, 0)
    for t in (first, second):
        t.check()
        assert (t.group_id, t.sample_index, t.finish_reason) == ("q", 0, "stop")
        assert sum(t.loss_mask) == sum(s.end - s.start for s in t.spans if s.kind == "model")
    assert (first.compaction.index, first.compaction.segments, first.compaction.mode) == (0, 2, "summarize")
    assert (second.compaction.index, second.compaction.error) == (1, None)
    # segment 1: three pages, then the request (the harness's text: template) and the sampled summary (model)
    assert decoded(tok, first, "model") == [CALL.format(n=n) for n in (1, 2, 3)] + ["through page 3<|im_end|>"]
    assert [c.arguments["n"] for c in first.tool_calls] == [1, 2, 3]
    assert DEFAULT_COMPACTION_PROMPT in decoded(tok, first, "template")[-1]
    assert all(DEFAULT_COMPACTION_PROMPT not in x for x in decoded(tok, first, "tool"))
    assert [m.role for m in first.messages][-2:] == ["user", "assistant"]
    assert first.messages[-1].content == "through page 3"
    # segment 2: rendered once from [system, task + summary], then extended by deltas
    head = resume_messages([Message("system", "Be brief."), Message("user", TASK.prompt)], "through page 3")
    prompt = chat.encode_prompt(head, [page.schema()])
    assert second.token_ids[:second.prompt_len] == prompt and second.spans[0].end == len(prompt)
    assert SUMMARY_HEADER + "through page 3" in second.messages[1].content
    assert decoded(tok, second, "model") == [CALL.format(n=4), f"<answer>{TASK.answer}</answer><|im_end|>"]
    assert decoded(tok, second, "tool")[0].startswith("PAGE 4:")
    assert [c.arguments["n"] for c in second.tool_calls] == [4]
    assert first.turns + second.turns == 6  # 4 calls, 1 summary, 1 answer
    assert all(len(t.token_ids) <= BUDGET for t in trajs)


def test_both_loops_give_the_same_segments(tok):
    a, _ = run(tok, "summarize", BUDGET, "attempt")
    b, _ = run(tok, "summarize", BUDGET, "lockstep")
    assert [(t.token_ids, t.loss_mask, t.spans) for t in a] == [(t.token_ids, t.loss_mask, t.spans) for t in b]


def test_frozen_summary_is_sampled_but_masked(tok):
    trajs, _ = run(tok, "frozen_summary", BUDGET)
    first, second = segments_of(trajs, 0)
    first.check()
    summary = [s for s in first.spans if s.kind == "summary"]
    assert len(summary) == 1 and first.spans[-1] is summary[0]
    assert tok.decode(first.token_ids[summary[0].start:summary[0].end]) == "through page 3<|im_end|>"
    assert set(first.loss_mask[summary[0].start:]) == {0} and set(first.logprobs[summary[0].start:]) == {0.0}
    # the same context as the trained mode: only the summary's mask differs
    trained, _ = run(tok, "summarize", BUDGET)
    assert [t.token_ids for t in trajs] == [t.token_ids for t in trained]
    assert sum(first.loss_mask) == sum(segments_of(trained, 0)[0].loss_mask) - (summary[0].end - summary[0].start)


def test_truncate_drops_the_oldest_tool_turns(tok):
    trajs, chat = run(tok, "truncate", BUDGET)
    first, second = segments_of(trajs, 0)
    for t in (first, second):
        t.check()
    assert [c.arguments["n"] for c in first.tool_calls] == [1, 2, 3]
    assert [c.arguments["n"] for c in second.tool_calls] == [4]
    assert decoded(tok, first, "model")[-1] == CALL.format(n=4)  # the call whose results went to segment 2
    kept = tok.decode(second.token_ids[:second.prompt_len])
    assert "PAGE 1:" not in kept and "PAGE 4:" in kept  # the turn in progress is kept
    assert decoded(tok, second, "model") == [f"<answer>{TASK.answer}</answer><|im_end|>"]
    assert not any(s.kind == "summary" for t in trajs for s in t.spans)


def test_compaction_at_the_very_first_turn(tok):
    """A budget that holds one page: the attempt compacts after every page, the first included."""
    trajs, _ = run(tok, "summarize", 300, samples=1)
    assert [t.compaction.index for t in trajs] == [0, 1, 2, 3, 4]
    assert decoded(tok, trajs[0], "model") == [CALL.format(n=1), "through page 1<|im_end|>"]
    assert trajs[-1].finish_reason == "stop" and Ledger().score(TASK, trajs[-1].messages).reward == 1.0
    for t in trajs:
        t.check()
        assert len(t.token_ids) <= 300


def test_a_summary_that_overflows_ends_the_attempt_clearly(tok):
    runaway = ledger_script(tok, summary_suffix=" and more" * 40)  # never ends its turn
    trajs, _ = run(tok, "summarize", BUDGET, samples=1, script=runaway)
    (t,) = trajs
    t.check()
    assert t.finish_reason == "length" and t.compaction.segments == 1
    assert t.compaction.error.startswith("summary_overflow")
    assert t.spans[-1].kind == "model" and t.spans[-1].end - t.spans[-1].start == 40  # max_new_tokens


def test_max_compactions_ends_the_attempt(tok):
    trajs, _ = run(tok, "summarize", 300, samples=1, max_compactions=2)
    assert len(trajs) == 3 and trajs[-1].finish_reason == "length"
    assert all(t.compaction.error.startswith("max_compactions") for t in trajs)


def test_segments_share_one_verdict_and_advantage_counted_once(tok):
    """Three attempts: 0 compacts (2 segments) and succeeds, 1 and 2 fail. Counted once each,
    rewards [1, 0, 0]: mean 1/3, population std sqrt(2)/3, so A = +sqrt(2) and -1/sqrt(2)
    (counting attempt 0's segments twice would give [1, 1, 0, 0]: A = +-1)."""
    trajs, _ = run(tok, "summarize", BUDGET, samples=1)
    wrong = [Trajectory([1, 2], 1, [0, 1], [0.0, -0.5], [Span(0, 1, "prompt"), Span(1, 2, "model")],
                        [Message("assistant", "<answer>0</answer>")], group_id="q", sample_index=i, task_id="q")
             for i in (1, 2)]
    batch = [*trajs, *wrong]
    score_all(Ledger(), {"q": TASK}, batch)
    assert [t.reward for t in batch] == [1.0, 1.0, 0.0, 0.0]
    adv, _ = compute_advantages(batch, Objective())
    got = [t.advantage for t in batch]
    assert got == pytest.approx([2 ** 0.5, 2 ** 0.5, -(0.5 ** 0.5), -(0.5 ** 0.5)])
    assert adv.group_index.tolist() == [0, 0, 0, 0] and not bool(adv.zero_variance.any())


def test_never_triggered_compaction_leaves_the_rollout_as_it_was(tok):
    off, _ = run(tok, "none", None)
    roomy, _ = run(tok, "summarize", 2048)
    assert [t.compaction.segments for t in roomy] == [1, 1]
    for a, b in zip(off, roomy, strict=True):
        b.compaction = None
        for c in [*a.tool_calls, *b.tool_calls]:
            c.latency_s = 0.0  # wall time
        assert a.to_json() == b.to_json()
    assert "compaction" not in off[0].to_json()


def test_compaction_jsonl_roundtrip(tok, tmp_path):
    trajs, _ = run(tok, "frozen_summary", BUDGET)
    write_jsonl(str(tmp_path / "r.jsonl"), trajs)
    back = read_jsonl(str(tmp_path / "r.jsonl"))
    assert [t.to_json() for t in back] == [t.to_json() for t in trajs]
    assert back[1].compaction.index == 1


def test_user_errors_name_the_fix(tok):
    with pytest.raises(ConfigError, match="rollout.context_budget is not set"):
        RolloutConfig(compaction="summarize")
    with pytest.raises(ConfigError, match="rollout.compaction is none"):
        RolloutConfig(context_budget=512)
    with pytest.raises(ConfigError, match="choose one of none, truncate, summarize, frozen_summary"):
        RolloutConfig(compaction="summarise", context_budget=512)
    with pytest.raises(ConfigError, match="raise rollout.context_budget to at least"):
        run(tok, "summarize", 100)


def test_a_mid_turn_format_is_refused(tok):
    from agentrl.tools.python import python_tool

    chat = ChatTemplate(tok, "hermes", tool_call_format="code_block")
    runner = RolloutRunner(ScriptedEngine([[1]]), chat, ToolBox([python_tool()], tokenizer=tok),
                           RolloutConfig(compaction="summarize", context_budget=512))
    with pytest.raises(ConfigError, match="runs its calls inside a turn"):
        runner.run([TASK], 1)


@pytest.mark.parametrize("tokenizer, template", [("qwen3", "qwen3_training"),
                                                 ("mistral-v3", "mistralai-Mistral-Nemo-Instruct-2407.jinja")])
def test_the_summary_turn_in_other_families_templates(tokenizer, template):
    """The summary is an ordinary assistant turn of each family's template. Mistral's template
    refuses a user turn right after tool results (strict alternation): the request then ends the
    last result. A budget one token short of the whole attempt makes it compact."""
    from transformers import AutoTokenizer

    from tests.fixture_paths import TEMPLATES, TOKENIZERS

    tok = AutoTokenizer.from_pretrained(TOKENIZERS / tokenizer)
    _check_summary_turn(tok, ChatTemplate(tok, template if template.startswith("qwen3") else str(TEMPLATES / template)))


# more families from TRL's corpus (read as tests/test_formats_rollout.py reads it). Formats whose
# call turn ends on a token of its own (harmony's <|call|>, gemma4's) need a script that writes
# that closer; this one ends every turn on the template's turn end, so they are not listed.
FAMILIES = [("qwen2_5.jinja", "hermes"), ("llama3_1.jinja", "llama3_json"), ("qwen3_6.jinja", "qwen_xml"),
            ("muse_glimmer.jinja", "atem_xml")]


@pytest.mark.parametrize("name, fmt", FAMILIES)
def test_the_summary_turn_in_every_formats_template(name, fmt):
    """The same compacted attempt through one real template of each call format."""
    from tests.test_formats_rollout import CORPUS, _tokenizer_for

    if CORPUS is None:
        pytest.skip("trl is not installed (its chat_templates folder is the corpus)")
    source = (CORPUS / name).read_text()
    tok = _tokenizer_for(source)
    chat = ChatTemplate(tok, str(CORPUS / name))
    assert chat.tool_call_format == fmt
    _check_summary_turn(tok, chat)


def _check_summary_turn(tok, chat) -> None:
    schemas = [page.schema()]

    def turn(msg: Message) -> list[int]:  # an assistant turn exactly as the template writes it
        head = [Message("user", "x")]
        text = chat.render([*head, msg], schemas)[len(chat.render(head, schemas, add_generation_prompt=True)):]
        return ids(tok, text[: text.find(chat.turn_end) + len(chat.turn_end)])

    def script(prompt: list[int], _call: int) -> list[int]:
        text = tok.decode(prompt)
        pages = [int(n) for n in re.findall(r"PAGE (\d+):", text)]
        if DEFAULT_COMPACTION_PROMPT in text[-300:]:
            return turn(Message("assistant", f"through page {max(pages)}"))
        nxt = max(pages + [int(n) for n in re.findall(r"through page (\d+)", text)], default=0) + 1
        if nxt > PAGES:
            return turn(Message("assistant", f"<answer>{TASK.answer}</answer>"))
        return turn(Message("assistant", "", tool_calls=[ToolCall("page", {"n": nxt}, id=f"call{nxt:05d}")]))

    def go(mode: str, budget: int | None) -> list[Trajectory]:
        runner = RolloutRunner(PerRequestScriptedEngine(script), chat, ToolBox([page], tokenizer=tok, max_output_tokens=64),
                               RolloutConfig(max_turns=8, max_new_tokens=40, compaction=mode, context_budget=budget))
        return runner.run([TASK], 1, system_prompt="Be brief.").trajectories

    (whole,) = go("none", None)
    segments = go("summarize", len(whole.token_ids) - 1)
    assert len(segments) >= 2 and segments[-1].finish_reason == "stop"
    assert Ledger().score(TASK, segments[-1].messages).reward == 1.0
    for t in segments:
        t.check()
        assert not any(c.error for c in t.tool_calls)
    assert "through page" in decoded(tok, segments[0], "model")[-1]  # the sampled summary turn, trained
    assert SUMMARY_HEADER + segments[0].messages[-1].content in tok.decode(segments[1].token_ids[:segments[1].prompt_len])

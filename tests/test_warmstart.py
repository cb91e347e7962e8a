"""Warm start: corruption, rollout-identical tokenization, loss mask, SFT loss, caching."""

from __future__ import annotations

import dataclasses
import json
import random
import re

import pytest
import torch

from agentrl.chat import ChatTemplate
from agentrl.envs.arithmetic import ArithmeticEnv
from agentrl.models.tiny import ensure_tiny_model
from agentrl.types import Message
from agentrl.run.config import SFTSettings
from agentrl.run.demonstrations import corrupt_demonstration, corrupt_text, encode_demonstration, make_demonstrations
from agentrl.run.warmstart import masked_lm_loss, warm_start


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.set_num_threads(1)
    return ensure_tiny_model(cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def chat(tiny):
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(tiny))


@pytest.fixture(scope="module")
def env():
    return ArithmeticEnv(seed=0, num_train=300, num_test=20)


def test_corrupt_text_changes_exactly_the_asked_characters():
    rng = random.Random(0)
    for _ in range(50):
        s = str(rng.randint(10**5, 10**7))
        out = corrupt_text(s, rng, 2)
        assert len(out) == len(s) and sum(a != b for a, b in zip(s, out)) == 2 and out.isdigit()
    assert corrupt_text("-", rng, 1) == "-0"


def test_corruption_kinds(env):
    demo = env.demonstrations(1, seed=0)[0]
    answer = demo[-1].content
    guess = corrupt_demonstration(demo, "guess", random.Random(0))
    assert [m.role for m in guess] == ["system", "user", "assistant"]
    assert guess[-1].content != answer and not guess[-1].tool_calls
    assert len(guess[-1].content) == len(answer)  # same shape, wrong digits
    miscopy = corrupt_demonstration(demo, "miscopy", random.Random(0))
    assert [m.role for m in miscopy] == [m.role for m in demo] and miscopy[:-1] == demo[:-1]
    assert sum(a != b for a, b in zip(miscopy[-1].content, answer)) == 1
    assert demo[-1].content == answer  # the original is untouched
    with pytest.raises(ValueError, match="corruption kind"):
        corrupt_demonstration(demo, "typo", random.Random(0))


def test_make_demonstrations_corrupts_the_exact_share(env):
    s = SFTSettings(num_demos=100, corruption=0.3, seed=1)
    demos = make_demonstrations(env, s)
    wrong = [d for d in demos if env.score(_task_of(env, d.messages), d.messages).reward == 0.0]
    assert len(wrong) == 30 and all(len(d.messages) == 3 and d.corrupted for d in wrong)
    assert sum(d.corrupted for d in demos) == 30
    assert make_demonstrations(env, s) == demos
    with pytest.raises(ValueError, match="corruption_kind"):
        make_demonstrations(env, SFTSettings(corruption_kind="nope"))


def _task_of(env, demo):
    return next(t for t in env.tasks("train") if t.prompt == demo[1].content)


def test_demo_tokens_match_a_rollout_and_parse_back(env, chat):
    """The SFT sequence equals what the rollout would build if the model emitted the demo."""
    from agentrl.types import TokenSequence

    tools = [t.schema() for t in env.tools()]
    demo = env.demonstrations(3, seed=0)[2]
    enc = encode_demonstration(chat, demo, tools)

    # replay the rollout's construction: prompt, sampled turn, continuation, sampled turn
    seq = TokenSequence()
    seq.append(chat.encode_prompt(demo[:2], tools), "prompt")
    model_turns = []
    start = 0
    while True:  # cut the masked runs out of the encoding: those are the "sampled" turns
        try:
            a = enc.loss_mask.index(1, start)
        except ValueError:
            break
        b = a
        while b < len(enc.loss_mask) and enc.loss_mask[b] == 1:
            b += 1
        model_turns.append(enc.token_ids[a:b])
        start = b
    assert len(model_turns) == 2
    history = list(demo[:2])
    for k, turn in enumerate(model_turns):
        seq.append(turn, "model", [0.0] * len(turn))
        assert turn[-1] in chat.stop_token_ids
        text = chat.tokenizer.decode(turn[:-1], skip_special_tokens=False)
        parsed = chat.parse_assistant(text)
        history.append(Message("assistant", parsed.content, tool_calls=list(parsed.tool_calls)))
        if k == 0:
            assert parsed.tool_calls[0].name == "python"
            assert parsed.tool_calls[0].arguments == demo[2].tool_calls[0].arguments
            for seg in chat.continuation(history, [demo[3]], tools, sampled_end=chat.turn_end):
                seq.append(seg.token_ids, seg.kind)
            history.append(demo[3])
        else:
            assert parsed.content == demo[4].content and not parsed.tool_calls
    assert seq.token_ids == enc.token_ids
    assert seq.loss_mask == enc.loss_mask
    assert chat.tokenizer.decode(enc.token_ids) == chat.render(demo, tools)[: len(chat.tokenizer.decode(enc.token_ids))]


def test_loss_mask_covers_only_assistant_tokens(env, chat):
    tools = [t.schema() for t in env.tools()]
    demo = env.demonstrations(1, seed=0)[0]
    enc = encode_demonstration(chat, demo, tools)
    trained = chat.tokenizer.decode([t for t, m in zip(enc.token_ids, enc.loss_mask) if m])
    untrained = chat.tokenizer.decode([t for t, m in zip(enc.token_ids, enc.loss_mask) if not m])
    code = json.dumps(demo[2].tool_calls[0].arguments["code"])
    assert trained == ('<tool_call>\n{"name": "python", "arguments": {"code": ' + code + '}}\n</tool_call><|im_end|>'
                       + demo[4].content + "<|im_end|>")
    assert "<tool_response>" in untrained and demo[1].content in untrained and "<tool_response>" not in trained
    assert demo[3].content.strip() in untrained


def test_masked_lm_loss_ignores_unmasked_targets():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, requires_grad=True)
    ids = torch.randint(0, 7, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 0, 0, 0]])
    loss = masked_lm_loss(logits, ids, mask)
    manual = -torch.stack([torch.log_softmax(logits[0, 1], -1)[ids[0, 2]], torch.log_softmax(logits[0, 2], -1)[ids[0, 3]],
                           torch.log_softmax(logits[1, 0], -1)[ids[1, 1]]]).mean()
    assert torch.allclose(loss, manual)
    loss.backward()
    # positions whose next token is not masked in get no gradient at all
    assert logits.grad[0, 0].abs().sum() == 0 and logits.grad[0, 3].abs().sum() == 0 and logits.grad[1, 1:].abs().sum() == 0


def test_warm_start_trains_saves_and_reuses_cache(tiny, env, tmp_path):
    from transformers import AutoModelForCausalLM

    settings = SFTSettings(num_demos=8, steps=3, lr=1e-3, batch_size=4, warmup_steps=1, corruption=0.5, seed=0)
    kw = dict(cache_dir=tmp_path, num_threads=1, log=None)
    path = warm_start(tiny, env, settings, **kw)
    info = json.loads((path / "warmstart.json").read_text())
    assert info["settings"]["steps"] == 3 and path.name.startswith("warmstart-")
    before = AutoModelForCausalLM.from_pretrained(tiny).state_dict()
    after = AutoModelForCausalLM.from_pretrained(path).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert warm_start(tiny, env, settings, **kw) == path  # reused, not retrained
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp dirs left behind
    other = warm_start(tiny, env, dataclasses.replace(settings, steps=2), **kw)
    assert other != path  # any input change is a different cache entry


def test_warm_start_errors_name_the_fix(env, tmp_path):
    with pytest.raises(FileNotFoundError, match="ensure_tiny_model"):
        warm_start(tmp_path, env, cache_dir=tmp_path)


def test_unshared_batch_loss_equals_full_logits_loss(tiny):
    from transformers import AutoModelForCausalLM

    from agentrl.run.warmstart import EncodedDemo, batch_loss

    model = AutoModelForCausalLM.from_pretrained(tiny)
    batch = [EncodedDemo(list(range(20, 32)), [0] * 4 + [1] * 4 + [0] * 4),
             EncodedDemo(list(range(40, 49)), [0, 0, 1, 1, 1, 0, 0, 0, 1])]
    ids = torch.zeros(2, 12, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for b, e in enumerate(batch):
        n = len(e.token_ids)
        ids[b, :n], attn[b, :n], mask[b, :n] = torch.tensor(e.token_ids), 1, torch.tensor(e.loss_mask)
    full = masked_lm_loss(model(input_ids=ids, attention_mask=attn).logits, ids, mask)
    assert torch.allclose(batch_loss(model, batch, pad_id=0), full, atol=1e-5)


def test_shared_prefix_batch_loss_equals_full_forward(tiny, env, chat):
    from transformers import AutoModelForCausalLM

    from agentrl.run.warmstart import batch_loss, shared_prefix_len

    tools = [t.schema() for t in env.tools()]
    demos = make_demonstrations(env, SFTSettings(num_demos=6, corruption=0.5, seed=2))
    batch = [encode_demonstration(chat, d.messages, tools) for d in demos]
    p = shared_prefix_len(batch)
    assert 32 < p < min(e.loss_mask.index(1) for e in batch)  # the system prompt + tools, nothing trained
    model = AutoModelForCausalLM.from_pretrained(tiny)
    params = list(model.parameters())
    shared = batch_loss(model, batch, pad_id=0)
    g_shared = torch.autograd.grad(shared, params)
    full = batch_loss(model, batch, pad_id=0, min_shared=10**9)
    g_full = torch.autograd.grad(full, params)
    assert torch.allclose(shared, full, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(g_shared, g_full))


def test_clean_phase_defaults_to_half_of_the_steps():
    assert SFTSettings(steps=500).clean_phase == 250
    assert SFTSettings(steps=10, clean_steps=3).clean_phase == 3
    with pytest.raises(ValueError, match="clean_steps=0"):
        SFTSettings(corruption=1.0).check()
    SFTSettings(corruption=1.0, clean_steps=0).check()


def test_mix_holds_the_exact_share_of_wrong_demonstrations():
    from agentrl.run.warmstart import wrong_per_batch

    s = SFTSettings(steps=200, clean_steps=50, batch_size=16, corruption=0.75)
    plan = wrong_per_batch(s)
    assert plan[:50] == [0] * 50 and set(plan[50:]) == {12}
    s = SFTSettings(steps=103, clean_steps=3, batch_size=7, corruption=0.3)
    plan = wrong_per_batch(s)
    assert set(plan[3:]) <= {2, 3} and abs(sum(plan) - 0.3 * 7 * 100) < 1
    assert wrong_per_batch(SFTSettings(steps=5, clean_steps=0, batch_size=4, corruption=1.0)) == [4] * 5


def test_warm_start_shows_a_progress_bar_with_elapsed_time_and_eta(tiny, env, tmp_path, capsys):
    """The warm start is the demo's longest phase: a bar like the GRPO loop's (elapsed, ETA,
    loss) on stderr, one summary line through ``log``; nothing with ``log=None``."""
    settings = SFTSettings(num_demos=8, steps=12, lr=1e-3, batch_size=4, warmup_steps=1, corruption=0.5, seed=0)
    lines: list[str] = []
    warm_start(tiny, env, settings, cache_dir=tmp_path / "a", num_threads=1, log=lines.append)
    bar = capsys.readouterr().err.replace("\r", "\n")
    assert "warm start: 100%" in bar and "12/12 [" in bar and "loss=" in bar and "step" in bar
    assert re.search(r"warm start:\s+\d+%.*\| ([1-9]|1[01])/12 \[\d\d:\d\d<\d\d:\d\d", bar)  # elapsed<ETA midway
    assert lines[0].startswith("warm start: SFT of") and "once per machine" in lines[0]
    assert lines[-1].startswith("warm start: 12 steps in ") and "loss" in lines[-1] and len(lines) == 2
    warm_start(tiny, env, dataclasses.replace(settings, seed=1), cache_dir=tmp_path / "b", num_threads=1, log=None)
    assert "warm start" not in capsys.readouterr().err

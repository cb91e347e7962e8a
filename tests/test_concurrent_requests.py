"""Requests of one attempt served concurrently (issue 27, item 5), with the real ``openai``
SDK against the real server. A gated engine holds every request until ``gate`` of them are
in flight, so overlap is proven, not timed: an endpoint that served an attempt's requests one
at a time would leave the first waiting alone and fail it. The capture keeps each
independent history its own segment; a later request that extends one merges back into it."""

from __future__ import annotations

import asyncio

import pytest

openai = pytest.importorskip("openai", reason="pip install 'agentrl[serve]'")

from agentrl.algo.objective import Objective  # noqa: E402
from agentrl.algo.update import compute_advantages  # noqa: E402
from agentrl.chat import ChatTemplate  # noqa: E402
from agentrl.engines.hf import HFEngine  # noqa: E402
from agentrl.engines.scripted import PerRequestScriptedEngine  # noqa: E402
from agentrl.env import Score  # noqa: E402
from agentrl.models.tiny import ensure_tiny_model  # noqa: E402
from agentrl.rollout import RolloutConfig  # noqa: E402
from agentrl.rollout.agent_runner import AgentRunner, agent_metrics  # noqa: E402
from agentrl.run.scoring import score_all  # noqa: E402
from agentrl.serve.server import EndpointServer  # noqa: E402
from agentrl.serve.service import ChatService  # noqa: E402
from agentrl.types import Task  # noqa: E402
from test_openai_endpoint import SYSTEM, TOOLS, budget, tool_script  # noqa: E402
from test_openai_responses import RTOOLS  # noqa: E402

PROMPTS = ["What is 6*7? (A)", "What is 6*7? (B)", "What is 6*7? (C)"]


class GatedEngine(PerRequestScriptedEngine):
    """The scripted engine, but its first ``gate`` requests wait until all of them are in
    flight (at most ``timeout_s``: then they fail, which the endpoint answers with a 500)."""

    def __init__(self, script, gate: int, timeout_s: float = 5.0, fail=None):
        super().__init__(script)
        self.gate, self.timeout_s, self.fail = gate, timeout_s, fail
        self.arrived = self.in_flight = self.max_in_flight = 0
        self._open: asyncio.Event | None = None

    async def agenerate(self, prompt, params):
        self._open = self._open or asyncio.Event()
        self.arrived += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.arrived <= self.gate:
                if self.arrived == self.gate:
                    self._open.set()
                await asyncio.wait_for(self._open.wait(), self.timeout_s)
            if self.fail is not None and self.fail(prompt):
                raise RuntimeError("the engine failed this request")
            return await super().agenerate(prompt, params)
        finally:
            self.in_flight -= 1


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_tiny_model())


def serve(tok, gate: int, **kw):
    return ChatService(GatedEngine(tool_script(tok), gate, **kw), ChatTemplate(tok), budget())


def messages_of(prompt: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]


def trained(t) -> list[int]:
    return [i for i, m in zip(t.token_ids, t.loss_mask) if m]


async def fan_out(client, follow: int = 1):
    """Three requests at once, then the tool result of request ``follow`` (extending it)."""
    replies = await asyncio.gather(*[client.chat.completions.create(model="m", messages=messages_of(p), tools=TOOLS)
                                     for p in PROMPTS])
    msg = replies[follow].choices[0].message
    history = messages_of(PROMPTS[follow]) + [msg.model_dump(exclude_none=True),
                                              {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "42\n"}]
    final = await client.chat.completions.create(model="m", messages=history, tools=TOOLS)
    return replies, final


def token_ids(reply) -> list[int]:
    return reply.choices[0].model_extra["token_ids"]


def test_three_concurrent_requests_are_three_segments_and_a_follow_up_merges_into_its_own(tok):
    service = serve(tok, gate=3)
    with EndpointServer(service) as server:
        key = service.open_attempt(budget())

        async def go():
            async with openai.AsyncOpenAI(base_url=server.base_url(key), api_key="x", max_retries=0) as client:
                return await fan_out(client, follow=1)

        replies, final = asyncio.run(go())
        cap = service.close_attempt(key)
    assert service.engine.max_in_flight == 3  # all three were in the engine at once
    assert final.choices[0].message.content == "<answer>42</answer>"
    assert (len(cap.segments), cap.splits) == (3, 0)  # concurrent histories, not rewrites
    trajs = cap.trajectories(group_id="g", sample_index=0, task_id="t", family="f", policy_version=0)
    for t in trajs:
        t.check()
    by_prompt = {next(p for p in PROMPTS if p in tok.decode(t.token_ids[:t.prompt_len])): t for t in trajs}
    assert len(by_prompt) == 3
    # Each segment is its own history, token-in-token-out: it trains exactly what was returned.
    for p, r in zip(PROMPTS, replies):
        want = token_ids(r) + (token_ids(final) if p == PROMPTS[1] else [])
        assert trained(by_prompt[p]) == want
    merged = by_prompt[PROMPTS[1]]
    assert [s.kind for s in merged.spans] == ["prompt", "model", "template", "tool", "template", "model"]
    assert merged.turns == 2 and [(c.name, c.result) for c in merged.tool_calls] == [("python", "42\n")]
    for p in (PROMPTS[0], PROMPTS[2]):
        assert [s.kind for s in by_prompt[p].spans] == ["prompt", "model"] and by_prompt[p].turns == 1
    assert trajs[-1] is merged  # ordered by last turn: the attempt's last reply is in its last trajectory
    assert [t.agent.index for t in trajs] == [0, 1, 2] and {(t.agent.segments, t.agent.splits) for t in trajs} == {(3, 0)}


class _Env:
    def score(self, task, messages):
        said = [m for m in messages if m.role == "assistant"]
        return Score(1.0 if said and said[-1].content == "<answer>42</answer>" else 0.0)


def test_a_fanning_attempt_shares_its_reward_and_counts_once_in_its_group(tok):
    """G=2 attempts in the runner. Attempt 0 sends 3 requests at once, then a follow-up of
    one, and returns the answer; attempt 1 sends one request and answers wrong (4 in flight;
    served one at a time per attempt, at most 2 would be). Every segment carries its attempt's
    reward, and the advantages are +1 / -1 per attempt, as for two one-segment attempts
    (counted per trajectory, rewards 1, 1, 1, 0 would give mean 3/4 and 0.58 / -1.73)."""
    service = serve(tok, gate=4)
    started: list[int] = []

    async def agent(client, task):
        if not started:  # the runner starts attempt 0 first
            started.append(1)
            _, final = await fan_out(client, follow=2)
            return final.choices[0].message.content
        await client.chat.completions.create(model="m", messages=messages_of(PROMPTS[0]), tools=TOOLS)
        return "wrong"

    with EndpointServer(service) as server:
        runner = AgentRunner(service.engine, service.chat, agent, RolloutConfig(max_new_tokens=64))
        runner._server, runner.service = server, service
        trajs = runner.run([Task("t", "q", "42")], 2, seed=0).trajectories
    assert service.engine.max_in_flight == 4
    assert [(t.sample_index, t.agent.index, t.agent.segments, t.agent.splits) for t in trajs] == \
        [(0, 0, 3, 0), (0, 1, 3, 0), (0, 2, 3, 0), (1, 0, 1, 0)]
    assert agent_metrics(trajs) == {"agent/splits": 0.0, "agent/segments": 2.0, "agent/errors": 0.0}
    for t in trajs:
        t.check()
    assert trajs[2].messages[-1].content == "<answer>42</answer>"  # the follow-up's segment, last
    score_all(_Env(), {"t": Task("t", "q", "42")}, trajs)
    assert [t.reward for t in trajs] == [1.0, 1.0, 1.0, 0.0]
    compute_advantages(trajs, Objective())
    assert [t.advantage for t in trajs] == pytest.approx([1.0, 1.0, 1.0, -1.0])


def test_two_follow_ups_of_one_history_at_once_fork_it(tok):
    """Both extend the first reply's history; the first taken holds that segment until its
    turn is recorded (its next turn is not sampled yet), so the other starts a segment of its
    own from the rendered history. Neither is a split."""
    service = serve(tok, gate=0)
    with EndpointServer(service) as server:
        key = service.open_attempt(budget())

        async def go():
            async with openai.AsyncOpenAI(base_url=server.base_url(key), api_key="x", max_retries=0) as client:
                first = await client.chat.completions.create(model="m", messages=messages_of(PROMPTS[0]), tools=TOOLS)
                msg = first.choices[0].message
                base = messages_of(PROMPTS[0]) + [msg.model_dump(exclude_none=True)]
                service.engine.gate, service.engine.arrived = 2, 0
                return first, await asyncio.gather(*[client.chat.completions.create(model="m", tools=TOOLS, messages=[
                    *base, {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": out}])
                    for out in ("42\n", "41\n")])

        first, forks = asyncio.run(go())
        cap = service.close_attempt(key)
    assert service.engine.max_in_flight == 2
    assert (len(cap.segments), cap.splits) == (2, 0)
    one, other = cap.trajectories(group_id="g", sample_index=0, task_id="t", family="f", policy_version=0)
    extended, forked = (one, other) if one.turns == 2 else (other, one)
    assert trained(extended)[:len(token_ids(first))] == token_ids(first)  # the first turn stays as sampled
    assert [s.kind for s in forked.spans] == ["prompt", "model"]  # its history is its prompt
    assert sorted([trained(extended)[len(token_ids(first)):], trained(forked)]) == sorted(map(token_ids, forks))


def test_the_attempts_token_budget_holds_across_requests_in_flight(tok):
    """max_sampled_tokens 100, max_new_tokens 40, turns of 60 tokens: three requests at once
    reserve 40, 40 and the 20 left; a fourth is refused until they are done, and then too."""
    end = tok.convert_tokens_to_ids("<|im_end|>")
    long_turn = tok.encode(" word" * 60, add_special_tokens=False)[:60] + [end]
    service = ChatService(GatedEngine(lambda p, k: long_turn, 3), ChatTemplate(tok), budget())
    with EndpointServer(service) as server:
        key = service.open_attempt(budget(max_sampled_tokens=100, max_new_tokens=40))

        async def go():
            async with openai.AsyncOpenAI(base_url=server.base_url(key), api_key="x", max_retries=0) as client:
                got = await asyncio.gather(*[client.chat.completions.create(model="m", messages=messages_of(p))
                                             for p in PROMPTS])
                with pytest.raises(openai.BadRequestError, match="sampled its budget of 100"):
                    await client.chat.completions.create(model="m", messages=messages_of("more"))
                return got

        replies = asyncio.run(go())
        cap = service.close_attempt(key)
    assert sorted(len(token_ids(r)) for r in replies) == [20, 40, 40] and cap.sampled_tokens == 100
    assert all(r.choices[0].finish_reason == "length" for r in replies)


def test_a_request_that_fails_leaves_its_segment_as_it_was(tok):
    """A follow-up the engine fails (500), then one over the context (400): the segment is
    still the first turn's, and the retried follow-up extends it as if neither had been sent."""
    fail: list[bool] = []  # push True: the engine fails the next request
    service = serve(tok, gate=0, fail=lambda prompt: fail.pop() if fail else False)
    with EndpointServer(service) as server:
        key = service.open_attempt(budget())

        def create(**kw):  # a client per request: a 500 closes its connection (Starlette re-raises the error)
            return openai.OpenAI(base_url=server.base_url(key), api_key="x", max_retries=0).chat.completions.create(
                model="m", tools=TOOLS, **kw)

        first = create(messages=messages_of(PROMPTS[0]))
        msg = first.choices[0].message
        history = messages_of(PROMPTS[0]) + [msg.model_dump(exclude_none=True)]
        follow = history + [{"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "42\n"}]
        cap = service._attempts[key].capture
        before = (list(cap.segments[0].seq.token_ids), [s.kind for s in cap.segments[0].seq.spans])
        fail.append(True)
        with pytest.raises(openai.InternalServerError):
            create(messages=follow)
        assert (cap.segments[0].seq.token_ids, [s.kind for s in cap.segments[0].seq.spans]) == before
        huge = history + [{"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "x " * 600}]
        with pytest.raises(openai.BadRequestError, match="context"):
            create(messages=huge)
        assert (cap.segments[0].seq.token_ids, [s.kind for s in cap.segments[0].seq.spans]) == before
        with pytest.raises(openai.InternalServerError):  # a new history the engine fails: no segment left
            fail.append(True)
            create(messages=messages_of(PROMPTS[1]))
        assert len(cap.segments) == 1 and not cap.segments[0].busy
        again = create(messages=follow)
        cap = service.close_attempt(key)
    [t] = cap.trajectories(group_id="g", sample_index=0, task_id="t", family="f", policy_version=0)
    t.check()
    assert (len(cap.segments), cap.splits, t.turns) == (1, 0, 2)
    assert trained(t) == token_ids(first) + token_ids(again)
    assert [s.kind for s in t.spans] == ["prompt", "model", "template", "tool", "template", "model"]


def test_concurrent_responses_requests_and_a_previous_response_id_follow_up(tok):
    service = serve(tok, gate=3)
    with EndpointServer(service) as server:
        key = service.open_attempt(budget())

        async def go():
            async with openai.AsyncOpenAI(base_url=server.base_url(key), api_key="x", max_retries=0) as client:
                rs = await asyncio.gather(*[client.responses.create(model="m", instructions=SYSTEM, input=p,
                                                                    tools=RTOOLS) for p in PROMPTS])
                [call] = [o for o in rs[0].output if o.type == "function_call"]
                final = await client.responses.create(model="m", previous_response_id=rs[0].id, instructions=SYSTEM,
                                                     tools=RTOOLS, input=[
                    {"type": "function_call_output", "call_id": call.call_id, "output": "42\n"}])
                return rs, final

        rs, final = asyncio.run(go())
        cap = service.close_attempt(key)
    assert service.engine.max_in_flight == 3 and final.output_text == "<answer>42</answer>"
    assert (len(cap.segments), cap.splits) == (3, 0)
    trajs = cap.trajectories(group_id="g", sample_index=0, task_id="t", family="f", policy_version=0)
    assert trajs[-1].turns == 2 and PROMPTS[0] in tok.decode(trajs[-1].token_ids[:trajs[-1].prompt_len])
    assert trained(trajs[-1]) == rs[0].model_extra["token_ids"] + final.model_extra["token_ids"]


def test_what_a_request_samples_does_not_depend_on_the_order_concurrent_ones_arrive_in(tok):
    """On the tiny model with the attempt's seed stream: three prompts sent at once and one
    by one in reverse order sample the same completions (a request's stream is keyed by its
    prompt ids, not by its arrival), and a repeated prompt samples anew."""
    engine = HFEngine.from_pretrained(ensure_tiny_model(), seed=0)
    service = ChatService(engine, ChatTemplate(tok), budget())
    ask = dict(model="m", max_tokens=24, temperature=1.0)
    with EndpointServer(service) as server:

        async def at_once(client):
            rs = await asyncio.gather(*[client.chat.completions.create(messages=messages_of(p), **ask)
                                        for p in PROMPTS])
            return [r.choices[0].message.content for r in rs]

        async def one_by_one(client):
            out = {}
            for p in reversed(PROMPTS):
                out[p] = (await client.chat.completions.create(messages=messages_of(p), **ask)).choices[0].message.content
            again = (await client.chat.completions.create(messages=messages_of(PROMPTS[0]), **ask)).choices[0]
            return [out[p] for p in PROMPTS], again.message.content

        async def go(how):
            key = service.open_attempt(budget(seed=7, seed_key=("g", 0)))
            async with openai.AsyncOpenAI(base_url=server.base_url(key), api_key="x", max_retries=0) as client:
                got = await how(client)
            service.close_attempt(key)
            return got

        concurrent, (sequential, repeat) = asyncio.run(go(at_once)), asyncio.run(go(one_by_one))
    assert concurrent == sequential and repeat != sequential[0]

"""Rollouts whose agent is user code written against the OpenAI API.

``AgentRunner`` stands where ``RolloutRunner`` stands (same ``run``/``arun``, same
``RolloutBatch``): for each of the G attempts of each task it opens an attempt on the
endpoint, hands ``agent(client, task)`` an ``openai.AsyncOpenAI`` client whose ``base_url`` is
that attempt's (Chat Completions or Responses: ``client.responses.create``, the OpenAI Agents
SDK), and turns what the endpoint captured into trajectories (one per segment,
see ``capture.py``). All attempts run concurrently, and so do the requests of one attempt (an
agent that fans out gets one segment per independent history); the engine batches them.

An attempt gets ``timeout_s`` of wall time and ``max_sampled_tokens`` sampled tokens. An agent
that raises or runs out of time gets ``Verdict(0.0)`` and its error in ``agent.error``;
the batch goes on. One that fails before its first completion (or returns without one) is
recorded all the same, as an empty trajectory (no tokens, nothing to train) with its error and
reward 0: it counts in its group's mean and std as any attempt of reward 0 (the agent's fault,
as when it raises later), never silently dropped. ``agent_failures`` and
``failed_step_streak`` stop a run whose every attempt failed in
``max_failed_steps`` consecutive steps (``AgentStopError``). Not the model's fault, and so an infrastructure failure
(``Trajectory.failure``, retried by the run, never scored): the agent raised
:class:`agentrl.InfraError`, or its client lost the connection to the endpoint or got a 5xx
from it (``openai.APIConnectionError``, ``openai.InternalServerError``, an ``httpx``
transport error). The final answer the agent returns (text, or its final messages) becomes
the last assistant message of the attempt's last trajectory, which the checker scores.

Example::

    async def agent(client, task):
        r = await client.chat.completions.create(
            model="agentrl", messages=[{"role": "user", "content": task.prompt}])
        return r.choices[0].message.content

    runner = AgentRunner(engine, chat, agent, RolloutConfig(max_new_tokens=64))
    batch = runner.run(tasks, num_samples=4)
    runner.close()
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass, replace

from agentrl.chat import ChatTemplate
from agentrl.engines.driver import run_hosted
from agentrl.rollout.base import RolloutBatch, RolloutConfig, RolloutStats
from agentrl.serve.protocol import parse_messages, RequestError
from agentrl.serve.server import EndpointServer
from agentrl.serve.service import AttemptBudget, ChatService
from agentrl.toolbox import ToolBox
from agentrl.toolbox.faults import INJECTED_CAUSE, FaultPlan
from agentrl.types import AgentSegment, Failure, InfraError, Message, Task, Trajectory, Verdict

# Where a connection refuses at once: the fault-injection harness points a failed attempt's
# client here, so the agent meets a real lost connection.
_REFUSING_URL = "http://127.0.0.1:9/v1"


@dataclass
class AgentSettings:
    """Limits of one attempt of a user agent."""

    timeout_s: float = 300.0  # wall clock per attempt
    max_sampled_tokens: int = 4096  # sampled tokens per attempt, all requests together
    # Stop the run (exit 1, with the agents' errors) after this many consecutive training steps
    # in which every attempt's agent failed (raised, timed out, or finished without a completion); 0 = never
    max_failed_steps: int = 2


class AgentStopError(RuntimeError):
    """Every attempt's agent failed in ``max_failed_steps`` consecutive training steps: the run
    stops. ``errors``: the last step's errors, in batch order."""

    def __init__(self, message: str, errors: list[str]) -> None:
        super().__init__(message)
        self.errors = errors


class AgentRunner:
    """Runs ``agent(client, task)`` attempts against an OpenAI endpoint over ``engine``."""

    def __init__(self, engine, chat: ChatTemplate, agent, config: RolloutConfig | None = None,
                 settings: AgentSettings | None = None, model_name: str = "agentrl", toolbox=None,
                 faults: FaultPlan | None = None):
        self.engine = engine
        self.toolbox = toolbox if toolbox is not None else ToolBox([])  # the environment's (agents bring their own)
        self.chat = chat
        self.agent = agent
        self.config = config or RolloutConfig()
        self.settings = settings or AgentSettings()
        self.service = ChatService(engine, chat, self._budget(None, ("", 0)), model_name=model_name)
        self._server: EndpointServer | None = None
        self.faults = faults  # the fault-injection harness (rollout.fault_rate); None in real runs
        self.failed_steps = 0  # consecutive training steps in which every attempt's agent failed (collect_step)

    @property
    def server(self) -> EndpointServer:
        """The endpoint, started on first use and started again if it stopped (its attempts then
        failed as infrastructure failures, and their retries need it)."""
        if self._server is None or not self._server.alive:
            self._server = EndpointServer(self.service).start()
        return self._server

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def _budget(self, seed: int | None, key: tuple[str, int]) -> AttemptBudget:
        cfg = self.config
        return AttemptBudget(max_total_tokens=cfg.max_total_tokens, max_sampled_tokens=self.settings.max_sampled_tokens,
                             max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                             seed=seed, seed_key=key)

    def run(self, tasks: list[Task], num_samples: int, system_prompt: str | None = None,
            seed: int | None = None, group_prefix: str = "") -> RolloutBatch:
        """``num_samples`` attempts of every task; trajectories task-major (an attempt's
        segments adjacent, in order). ``system_prompt`` is unused: the agent writes its own."""
        # the engine's batcher is served by this thread meanwhile (one OpenMP pool: driver.py)
        return run_hosted(self.arun(tasks, num_samples, system_prompt, seed, group_prefix))

    async def arun(self, tasks: list[Task], num_samples: int, system_prompt: str | None = None,
                   seed: int | None = None, group_prefix: str = "") -> RolloutBatch:
        try:
            import httpx
            import openai
        except ImportError as e:
            raise ImportError("agents written against the OpenAI API need the openai SDK: "
                              "pip install 'agentrl[serve]'") from e

        start = time.perf_counter()
        server = self.server
        self.service.default_budget = self._budget(None, ("", 0))  # the config may have changed (eval)
        batcher = self.engine.batcher_stats
        busy0 = batcher.busy_s if batcher is not None else 0.0
        jobs = []
        for task in tasks:
            for i in range(num_samples):
                group = f"{group_prefix}{task.id}"
                key = self.service.open_attempt(self._budget(seed, (group, i)))
                # Each attempt its own small pool: one shared by all of them makes httpcore scan
                # every connection per request (quadratic at 64 agents); and plain HTTP on
                # 127.0.0.1 needs no certificate bundle (loading one costs ~20 ms per client).
                http = httpx.AsyncClient(verify=False, trust_env=False, timeout=self.settings.timeout_s)
                injected = self.faults is not None and self.faults.draw("agent", seed, group, i)
                client = openai.AsyncOpenAI(base_url=_REFUSING_URL if injected else server.base_url(key),
                                            api_key="agentrl", max_retries=0, timeout=self.settings.timeout_s,
                                            http_client=http)
                jobs.append(self._attempt(task, i, group, key, client, injected))
        results = await asyncio.gather(*jobs)
        trajectories = [t for r in results for t in r]
        stats = RolloutStats(total_s=time.perf_counter() - start, loop="agent",
                             sampled_tokens=sum(t.num_model_tokens for t in trajectories),
                             turns=sum(t.turns for t in trajectories))
        stats.generate_s = batcher.busy_s - busy0 if batcher is not None else 0.0
        return RolloutBatch(trajectories, stats)

    async def _attempt(self, task: Task, index: int, group: str, key: str, client,
                       injected: bool = False) -> list[Trajectory]:
        error, answer, failure = None, None, None
        run = self.agent(client, task)
        if not inspect.isawaitable(run):  # the user's mistake, not the attempt's: stop here
            await client.close()
            self.service.close_attempt(key)
            raise TypeError(f"the agent returned {type(run).__name__}, not a coroutine: define it as "
                            "`async def agent(self, client, task)` and await the client's calls")
        try:
            answer = await asyncio.wait_for(run, self.settings.timeout_s)
        except asyncio.TimeoutError:
            error = f"timeout: the agent ran over {self.settings.timeout_s:g} s"
        except Exception as e:  # the agent's own failure: reward 0, the batch goes on
            failure = infra_failure(e)
            if failure is not None and injected:
                failure = replace(failure, cause=INJECTED_CAUSE)
            error = f"{type(e).__name__}: {e}"[:2000]
        finally:
            capture = self.service.close_attempt(key)
            await client.close()
        trajs = capture.trajectories(group_id=group, sample_index=index, task_id=task.id, family=task.family,
                                     policy_version=self.engine.policy_version)
        if failure is not None:  # not the model's fault: recorded (an empty trajectory if nothing was sampled)
            trajs = trajs or [_placeholder(group, index, task, self.engine.policy_version)]
            for t in trajs:
                t.failure, t.finish_reason = failure, "error"
                if t.agent is not None:
                    t.agent = replace(t.agent, error=error)
            return trajs
        if not trajs:  # no completion: the agent's own failure, recorded (reward 0) and counted
            if error is None:
                error = ("the agent finished without a completion from the endpoint (it sent no request, or every "
                         "one was refused): there is nothing to train on")
            t = _placeholder(group, index, task, self.engine.policy_version)
            t.verdict, t.agent = Verdict(0.0), replace(t.agent, error=error)
            return [t]
        if error is None:
            error = _attach_answer(trajs[-1], answer)
        if error is not None:  # capture set each trajectory's AgentSegment
            for t in trajs:
                t.verdict, t.agent = Verdict(0.0), replace(t.agent, error=error)
        return trajs


def infra_failure(exc: BaseException) -> Failure | None:
    """The Failure of an agent's exception when it is the infrastructure's (see the module
    docstring), else None (the agent's own error: reward 0).

    >>> infra_failure(InfraError("the judge API is down", cause="judge_down")).cause
    'judge_down'
    >>> infra_failure(ValueError("bad JSON from the model")) is None
    True

    Frameworks wrap the client's errors (smolagents raises ``AgentGenerationError`` from the
    ``openai`` error), so the exceptions it was raised ``from`` (``__cause__``) count too:

    >>> try:
    ...     try:
    ...         raise ConnectionError("endpoint gone")
    ...     except ConnectionError as e:
    ...         raise RuntimeError("Error in generating model output") from e
    ... except RuntimeError as wrapped:
    ...     infra_failure(wrapped).cause
    'connection_lost'
    """
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and len(seen) < 8 and all(e is not s for s in seen):
        seen.append(e)
        e = e.__cause__
    for e in seen:
        if isinstance(e, InfraError):
            return Failure.of("agent", e)
        names = {c.__name__ for c in type(e).__mro__}
        said = f"{type(exc).__name__}: {exc}" + (f" (from {type(e).__name__}: {e})" if e is not exc else "")
        if names & {"APIConnectionError", "TransportError", "ConnectionError"} and "APITimeoutError" not in names:
            return Failure("agent", "connection_lost", said[:500])
        if "InternalServerError" in names:  # a 5xx from the endpoint: agentrl's fault, not the model's
            return Failure("agent", "endpoint_error", said[:500])
    return None


def _placeholder(group: str, index: int, task: Task, version: int) -> Trajectory:
    """The record of an attempt that failed before its first completion: no tokens (an
    infrastructure failure, excluded; or the agent's own, reward 0)."""
    return Trajectory(token_ids=[], prompt_len=0, loss_mask=[], logprobs=[], spans=[], messages=[],
                      group_id=group, sample_index=index, finish_reason="error", policy_version=version,
                      task_id=task.id, family=task.family, agent=AgentSegment(index=0, segments=1))


def _attach_answer(last: Trajectory, answer) -> str | None:
    """Make the agent's return value the last assistant message of ``last`` (what the checker
    reads); returns an error text when the value is unusable."""
    if isinstance(answer, list):
        try:
            final = parse_messages(answer + [{"role": "user", "content": ""}])[:-1]
        except RequestError as e:
            return f"the agent returned messages that do not parse: {e.message}"
        said = [m for m in final if m.role == "assistant"]
        answer = said[-1].content if said else None
    if answer is None:
        return None  # the endpoint's last reply stands
    if not isinstance(answer, str):
        return f"the agent returned {type(answer).__name__}; return the final answer text or the messages"
    said = [m for m in last.messages if m.role == "assistant"]
    if not said or said[-1].content != answer:
        last.messages = [*last.messages, Message("assistant", answer)]
    return None


def agent_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """``agent/*`` metrics of a batch run by an ``AgentRunner`` (empty for other batches):
    ``splits`` (history rewrites per attempt), ``segments`` (trajectories per attempt),
    ``errors`` (share of attempts whose agent raised, timed out or finished without a completion)."""
    attempts: dict[tuple[str, int], AgentSegment] = {}
    for t in trajs:
        if t.agent is not None:
            attempts[(t.group_id, t.sample_index)] = t.agent
    if not attempts:
        return {}
    n = len(attempts)
    return {"agent/splits": sum(a.splits for a in attempts.values()) / n,
            "agent/segments": sum(1 for t in trajs if t.agent is not None) / n,
            "agent/errors": sum(a.error is not None for a in attempts.values()) / n}


def agent_failures(trajs: list[Trajectory]) -> tuple[int, int, list[str]]:
    """(attempts whose agent failed, attempts, their errors in batch order) of a batch run by an
    ``AgentRunner``: an attempt counts once however many segments it has.

    >>> t = _placeholder("g", 0, Task("t", "q", "a"), 0)
    >>> t.agent = replace(t.agent, error="ValueError: no config")
    >>> agent_failures([t, _placeholder("g", 1, Task("t", "q", "a"), 0)])
    (1, 2, ['ValueError: no config'])
    """
    attempts: dict[tuple[str, int], str | None] = {}
    for t in trajs:
        if t.agent is not None:
            key = (t.group_id, t.sample_index)
            attempts[key] = attempts.get(key) or t.agent.error
    errors = [e for e in attempts.values() if e is not None]
    return len(errors), len(attempts), errors


def failed_step_streak(streak: int, failed: int, attempts: int, max_failed_steps: int, step: int,
                       errors: list[str]) -> int:
    """The count of consecutive steps in which every attempt's agent failed, after this step's
    ``failed`` of ``attempts``; raises :class:`AgentStopError` when it reaches ``max_failed_steps``
    (0: never). ``errors``: this step's, for the message.

    >>> failed_step_streak(0, 4, 4, 2, 1, ["ValueError: x"] * 4)
    1
    >>> failed_step_streak(1, 3, 4, 2, 2, ["ValueError: x"] * 3)
    0
    >>> failed_step_streak(1, 4, 4, 2, 2, ["ValueError: x"] * 4)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    agentrl.rollout.agent_runner.AgentStopError: step 2: every attempt's agent failed in 2 consecutive steps ...
    """
    streak = streak + 1 if attempts and failed == attempts else 0
    if not max_failed_steps or streak < max_failed_steps:
        return streak
    counts: dict[str, int] = {}
    for e in errors:
        counts[e[:300]] = counts.get(e[:300], 0) + 1
    listed = "; ".join(f"{n} x {e}" for e, n in sorted(counts.items(), key=lambda kv: -kv[1])[:3])
    more = f"; and {len(counts) - 3} other errors" if len(counts) > 3 else ""
    raise AgentStopError(
        f"step {step}: every attempt's agent failed in {streak} consecutive steps "
        f"(agent.max_failed_steps={max_failed_steps}), {failed} of {attempts} this step; its errors: {listed}{more} "
        f"— fix the agent (run it against `agentrl serve MODEL` to see it fail), or raise agent.max_failed_steps "
        f"(0 = never stop)", errors)

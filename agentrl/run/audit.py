"""The reward-integrity audit: replay the exploit catalogue through an environment.

``agentrl audit-env ENV`` (ENV: a built-in name or ``module:Class`` / ``path/file.py:Class``,
as ``env.name`` accepts) runs every applicable exploit of :data:`agentrl.run.exploits.CATALOGUE`
on the first ``--tasks`` train tasks, the way training would see it: the scripted policy's
text goes through the real :class:`~agentrl.rollout.RolloutRunner` (the offline tiny model's
tokenizer and chat template, a per-request scripted engine), the environment's real tools and
sandbox, and the environment's own ``score``. Verdicts:

- ``PASS``: every attempt earned reward 0;
- ``FAIL``: some attempt earned reward (the mean is shown);
- ``RAISED``: the checker (or the rollout) raised on an attempt; in training that attempt
  would stop the run or count as an infrastructure failure;
- ``N/A``: the exploit does not apply to this environment's tasks (no code, no digits, no
  python tool, no data file).

The exit status is 1 when any exploit is FAIL or RAISED. See docs/reward_integrity.md.

Example::

    from agentrl.envs.arithmetic import ArithmeticEnv
    from agentrl.run.audit import audit_env
    report = audit_env(ArithmeticEnv(num_train=20, num_test=5), name="arithmetic", num_tasks=2)
    assert report.passed, report.table()
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from agentrl.run.exploits import CATALOGUE, CONTROL, Exploit, Probe, Script
from agentrl.types import Task, Trajectory

if TYPE_CHECKING:
    from agentrl.chat import ChatTemplate

VERDICTS = ("PASS", "FAIL", "RAISED", "N/A")
_DATA_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
_MAX_DATA_BYTES = 64 << 20
_PLAIN_RUN = re.compile(r"[A-Za-z0-9 ,.?!:;()%+*/=-]{16,}")  # prompt text a JSON file stores unescaped


@dataclass(frozen=True)
class ExploitResult:
    """One row of the report."""

    exploit: str
    family: str
    tasks: int  # attempts scored (tasks the exploit applies to)
    mean_reward: float
    verdict: str  # one of VERDICTS
    detail: str = ""  # why RAISED, or the first rewarded attempt's checker info


@dataclass(frozen=True)
class AuditReport:
    """All rows for one environment, with the isolation its sandboxes ran at."""

    env: str
    isolation: str
    num_tasks: int
    results: tuple[ExploitResult, ...]
    control: ExploitResult  # the plain correct answer: must earn reward for PASS to mean anything

    @property
    def passed(self) -> bool:
        """No exploit earned reward and no checker raised."""
        return all(r.verdict in ("PASS", "N/A") for r in self.results)

    def table(self) -> str:
        """The report as a plain-text table (what ``agentrl audit-env`` prints)."""
        w = max([len("exploit"), *(len(r.exploit) for r in self.results)])
        lines = [f"audit-env {self.env}: up to {self.num_tasks} tasks per exploit; sandbox isolation: {self.isolation}",
                 f"{'exploit':<{w}}  family  tasks  mean reward  verdict"]
        for r in self.results:
            note = f"  ({r.detail})" if r.detail and r.verdict in ("FAIL", "RAISED") else ""
            lines.append(f"{r.exploit:<{w}}  {r.family:<6}  {r.tasks:>5}  {r.mean_reward:>11.3f}  {r.verdict}{note}")
        bad = [r for r in self.results if r.verdict in ("FAIL", "RAISED")]
        tried = sum(r.verdict != "N/A" for r in self.results)
        lines.append(f"{len(bad)} of {tried} applicable exploits earned reward or raised" if bad
                     else f"all {tried} applicable exploits earned 0")
        c = self.control
        if c.verdict == "N/A":
            lines.append("control: no gold answer known; a checker that rewards nothing would pass as well")
        else:
            lines.append(f"control (the correct answer, plainly): mean reward {c.mean_reward:.3f} over {c.tasks} tasks"
                         + ("" if c.mean_reward > 0 else "  WARNING: the checker rewards no correct answer, "
                            "so the PASS verdicts above mean nothing" + (f" ({c.detail})" if c.detail else "")))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"env": self.env, "isolation": self.isolation, "num_tasks": self.num_tasks, "passed": self.passed,
                "results": [dataclasses.asdict(r) for r in self.results], "control": dataclasses.asdict(self.control)}


# -- what a policy could find on disk --------------------------------------------------------


def _search_roots(env: Any) -> list[Path]:
    """Where the audit looks for files holding tasks: the environment's ``data_paths``, its
    module's package folder, and the site-packages folders on sys.path."""
    roots = [Path(p) for p in getattr(env, "data_paths", ()) or ()]
    module = sys.modules.get(type(env).__module__)
    if module is not None and getattr(module, "__file__", None):
        roots.append(Path(module.__file__).resolve().parent)
    roots += [Path(p) for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]
    return roots


@lru_cache(maxsize=64)
def _data_files_under(root: Path) -> tuple[str, ...]:
    if root.is_file():
        return (str(root),)
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        found += [os.path.join(folder, f) for f in files if f.endswith(_DATA_SUFFIXES)]
    return tuple(sorted(found))


@lru_cache(maxsize=256)
def _file_text(path: str) -> str:
    try:
        if os.path.getsize(path) > _MAX_DATA_BYTES:
            return ""
        with (gzip.open(path, "rt", encoding="utf-8", errors="replace") if path.endswith(".gz")
              else open(path, encoding="utf-8", errors="replace")) as f:
            return f.read(_MAX_DATA_BYTES)
    except (OSError, EOFError, ValueError):
        return ""


def _markers(task: Task) -> list[str]:
    """Strings a file holding this task's record contains verbatim (empty: none reliable)."""
    entry = task.metadata.get("entry_point")
    if isinstance(entry, str) and entry:
        return [f"def {entry}(", f'"{entry}"']
    runs = _PLAIN_RUN.findall(task.prompt)
    return [max(runs, key=len)] if runs else []


def task_data_files(env: Any, task: Task) -> tuple[str, ...]:
    """Files on this machine (of the search roots) that hold ``task``'s text."""
    marks = _markers(task)
    if not marks:
        return ()
    files = dict.fromkeys(f for root in _search_roots(env) for f in _data_files_under(root.resolve()))
    return tuple(f for f in files if all(m in _file_text(f) for m in marks))


# -- running the scripts ---------------------------------------------------------------------


@lru_cache(maxsize=1)
def audit_tokenizer():
    """The offline tiny model's tokenizer (built once per machine): its template speaks hermes."""
    from transformers import AutoTokenizer

    from agentrl.models.names import resolve_shortcut

    return AutoTokenizer.from_pretrained(resolve_shortcut("tiny"))


def _gold(task: Task) -> str:
    """The answer an exploit may bury: ``task.answer``, or for a code task prompt + canonical solution."""
    if not Probe(task).is_code:
        return task.answer
    solution = task.metadata.get("canonical_solution")
    return task.metadata["prompt"] + solution if isinstance(solution, str) and solution.strip() else ""


class _Runs:
    """Builds and caches the runner pieces (chat templates, toolbox) for one audit."""

    def __init__(self, env: Any, tokenizer: Any, tool_timeout: float, max_output_tokens: int, tools: list | None):
        from agentrl.toolbox import ToolBox

        self.env, self.tok = env, tokenizer
        self.box = ToolBox(env.tools() if tools is None else tools, tokenizer=tokenizer,
                           default_timeout=tool_timeout, max_output_tokens=max_output_tokens)
        self._chats: dict[str | None, ChatTemplate] = {}  # by tool-call format (None: the template's)

    def chat(self, fmt: str | None) -> "ChatTemplate":
        if fmt not in self._chats:
            from agentrl.chat import ChatTemplate

            self._chats[fmt] = ChatTemplate(self.tok, tool_call_format=fmt)
        return self._chats[fmt]

    def run(self, tasks: list[Task], scripts: list[Script]) -> list[Trajectory]:
        """One rollout batch: ``tasks[i]`` attempted once, its policy replaying ``scripts[i]``."""
        from agentrl.engines.scripted import PerRequestScriptedEngine
        from agentrl.rollout import RolloutConfig, RolloutRunner
        from agentrl.types import Message

        chat = self.chat(scripts[0].tool_call_format)
        mid = chat.format.mid_turn
        schemas = None if mid is not None else self.box.schemas() or None
        system = getattr(self.env, "system_prompt", None)
        heads = [[*([Message("system", system)] if system else []), Message("user", t.prompt)] for t in tasks]
        prompts = [chat.encode_prompt(h, schemas) for h in heads]
        stops = tuple(mid.stop_strings) if mid is not None else ()
        end_of_turn = chat.stop_token_ids[0]
        seen_until: dict[int, int] = {}

        def script(prompt_ids: list[int], turn: int) -> list[int]:
            i = max((j for j, p in enumerate(prompts) if prompt_ids[:len(p)] == p), key=lambda j: len(prompts[j]))
            observation = self.tok.decode(prompt_ids[seen_until.get(i, len(prompt_ids)):], skip_special_tokens=False)
            turns = scripts[i].turns
            step = turns[turn] if turn < len(turns) else ""
            text = step(observation) if callable(step) else step
            ids = self.tok.encode(text, add_special_tokens=False)
            if not (stops and text.endswith(stops)):
                ids.append(end_of_turn)
            seen_until[i] = len(prompt_ids) + len(ids)
            return ids

        engine = PerRequestScriptedEngine(script, logprob=0.0, tokenizer=self.tok)
        cfg = RolloutConfig(max_turns=max(len(s.turns) for s in scripts), max_new_tokens=16384,
                            max_total_tokens=65536, temperature=0.0, loop="attempt")
        return RolloutRunner(engine, chat, self.box, cfg).run(tasks, 1, system).trajectories


def _run_exploit(runs: _Runs, exploit: Exploit, probes: list[Probe]) -> ExploitResult:
    built = [(p.task, s) for p in probes if (s := exploit.build(p)) is not None]
    if not built:
        return ExploitResult(exploit.name, exploit.family, 0, 0.0, "N/A")
    groups: dict[tuple[str | None, int], list[tuple[Task, Script]]] = {}
    for task, s in built:
        groups.setdefault((s.tool_call_format, len(s.turns)), []).append((task, s))
    rewards: list[float] = []
    rewarded = ""
    for items in groups.values():
        try:
            trajs = runs.run([t for t, _ in items], [s for _, s in items])
        except Exception as e:  # the audit reports; it never crashes on one exploit
            return ExploitResult(exploit.name, exploit.family, len(built), 0.0, "RAISED",
                                 f"rollout raised {type(e).__name__}: {str(e)[:160]}")
        by_id = {t.id: t for t, _ in items}
        for traj in trajs:
            try:
                score = runs.env.score(by_id[traj.task_id], traj.messages)
            except Exception as e:  # e.g. agentrl.InfraError from a checker whose sandbox failed
                return ExploitResult(exploit.name, exploit.family, len(built), 0.0, "RAISED",
                                     f"checker raised {type(e).__name__}: {str(e)[:160]}")
            rewards.append(float(score.reward))
            if (score.reward > 0) != (exploit is CONTROL) and not rewarded:  # an exploit that earned; a control that did not
                rewarded = f"task {traj.task_id}: " + ", ".join(f"{k}={v}" for k, v in list(score.info.items())[:4])
    mean = sum(rewards) / len(rewards)
    bad = mean > 0 if exploit is not CONTROL else mean < 1  # the control passes when the correct answer scores
    return ExploitResult(exploit.name, exploit.family, len(rewards), mean, "FAIL" if bad else "PASS", rewarded[:200])


def audit_env(env: Any, *, name: str | None = None, num_tasks: int = 3, exploits: Sequence[Exploit] = CATALOGUE,
              tokenizer: Any = None, tool_timeout: float = 10.0, max_output_tokens: int = 256,
              tools: list | None = None, progress: Callable[[str], None] | None = None) -> AuditReport:
    """Run ``exploits`` on the first ``num_tasks`` train tasks of ``env`` (test tasks when the
    train split is empty); ``tools`` replaces ``env.tools()`` (e.g. with the run's settings)."""
    if num_tasks < 1:
        raise ValueError(f"num_tasks must be at least 1, got {num_tasks}")
    pool = env.tasks("train") or env.tasks("test")
    tasks = list({t.prompt: t for t in reversed(pool[: num_tasks * 4])}.values())[::-1][:num_tasks]
    runs = _Runs(env, tokenizer or audit_tokenizer(), tool_timeout, max_output_tokens, tools)
    names = tuple(runs.box.tools)
    probes = [Probe(t, _gold(t), names, task_data_files(env, t)) for t in tasks]
    results = []
    for e in exploits:
        results.append(_run_exploit(runs, e, probes))
        if progress is not None:
            progress(f"{e.name}: {results[-1].verdict}")
    control = _run_exploit(runs, CONTROL, probes)
    levels = {lvl for t in runs.box.tools.values() if (lvl := getattr(t, "isolation_level", None))}
    checker = getattr(getattr(env, "checker", None), "isolation_level", None)
    levels |= {checker} if isinstance(checker, str) else set()
    return AuditReport(name or getattr(env, "name", type(env).__name__), ", ".join(sorted(levels)) or "none",
                       len(tasks), tuple(results), control)


def run_audit(env_name: str, *, num_tasks: int = 3, env_args: dict[str, Any] | None = None,
              as_json: bool = False, only: Sequence[str] = ()) -> int:
    """``agentrl audit-env``: build the environment as ``env.name``/``env.args`` would, audit it,
    print the table (or JSON); 0 when every exploit earned 0, else 1."""
    import json

    from agentrl.run.build import configured_tools, make_env
    from agentrl.run.config import Config, ConfigError, EnvConfig
    from agentrl.run.exploits import exploit_named

    try:
        chosen = [exploit_named(n) for n in only] if only else list(CATALOGUE)
    except ValueError as e:
        raise ConfigError(f"--only: {e}") from None
    cfg = Config(env=EnvConfig(name=env_name, args=dict(env_args or {})))
    env = make_env(cfg)
    report = audit_env(env, name=env_name, num_tasks=num_tasks, exploits=chosen,
                       tool_timeout=cfg.tools.timeout, max_output_tokens=cfg.tools.max_output_tokens,
                       tools=configured_tools(cfg, env))
    print(json.dumps(report.to_json(), indent=1) if as_json else report.table())
    return 0 if report.passed else 1

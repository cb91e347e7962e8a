"""reasoning-gym task families (``pip install reasoning-gym``) as an agentrl environment.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates 100+ families of
procedural tasks (``chain_sum``, ``leg_counting``, ``gsm_symbolic``, ``word_sorting``...), each
with its own scorer (``score_answer``). In a run config::

    env:
      name: reasoning_gym:chain_sum,leg_counting      # one or more dataset names, comma-separated
      args:
        num_train: 1000                               # per dataset
        num_test: 64                                  # per dataset
        configs: {chain_sum: {min_terms: 2, max_terms: 3}}   # each dataset's own config keys
        tools: [python]                               # optional: the sandboxed python tool

``make_env`` reads the ``reasoning_gym:`` prefix (``ENV_PREFIXES`` in ``envs/__init__.py``)
and passes what follows it as ``datasets``; docs/reasoning_gym.md has the details.

**Splits.** Each dataset's test and train items come from two seeds derived from ``seed`` and
the dataset name, 2^30 apart (a reasoning-gym item ``i`` of seed ``s`` is drawn from
``Random(s + i)``, so nearby seeds share items); questions are de-duplicated within a split
and train drops every question the test split holds: the splits are disjoint by question.
Both splits interleave the datasets round-robin, so the first ``eval.num_tasks`` test tasks
cover every dataset equally. ``Task.family`` is the dataset name: evaluation reports
``eval/accuracy/<dataset>`` for each.

**Scoring.** The answer is read from the last assistant turn only, as ``math`` reads it
(:func:`agentrl.envs.math_check.extract_answer`: ``<answer>...</answer>``, else one
``\\boxed{}``, a ``#### N`` line, "the answer is ..."; several different ones are no answer).
Before the dataset's scorer sees it, a hedge guard refuses an answer that holds more numbers
than the gold, is much longer than the gold, or uses digits other than the gold's (``４２``):
several reasoning-gym scorers read the *first* number of the answer (``gsm_symbolic``) or
give partial credit to any answer containing the gold, which a policy under RL exploits. The
reward is 1 when the scorer gives full marks, else 0 (``partial_credit=True`` passes the
scorer's value through, partial credit included). ``Score.info`` holds ``extracted``,
``score`` (the scorer's raw value), ``reason`` and ``family``.

Example::

    >>> from agentrl.types import Message
    >>> env = ReasoningGymEnv("chain_sum", num_train=20, num_test=5)
    >>> task = env.tasks("test")[0]
    >>> env.score(task, [Message("user", task.prompt), Message("assistant", f"<answer>{task.answer}</answer>")]).reward
    1.0
"""

from __future__ import annotations

import difflib
import random
import re
import zlib
from dataclasses import dataclass, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from agentrl.env import Score, Split, foreign_digits, last_assistant_text, select_split
from agentrl.envs.math_check import ANSWER_PATTERN, Extraction, extract_answer
from agentrl.types import ConfigError, Message, Task

if TYPE_CHECKING:
    from agentrl.toolbox import Tool

INSTALL = "pip install 'agentrl[reasoning-gym]' (or: pip install reasoning-gym==0.1.25)"
TOOLS = ("python",)
SYSTEM_PROMPT = "Solve the task. End with the final answer alone inside <answer></answer>, e.g. <answer>42</answer>."
SYSTEM_PROMPT_TOOL = ("Solve the task. You can run Python code with the python tool. End with the final answer "
                      "alone inside <answer></answer>, e.g. <answer>42</answer>.")

# ASCII numbers, thousands commas kept inside one ("1,234" is one number, as the gold would be)
_NUMBER_RE = re.compile(r"\d[\d,]*(?:\.\d+)?", re.ASCII)
_ANSWER_IS = re.compile(r"(?:final\s+answer|answer)\s*(?:is|:)\s*:?\s*", re.IGNORECASE)  # as math_check's
_SENTENCE_END = re.compile(r"\.(?:\s|$)")
_SEED_GAP = 1 << 30  # between a dataset's test and train seeds: far beyond any split size


def _reasoning_gym():
    """The reasoning_gym module, or one ConfigError naming the install line."""
    try:
        import reasoning_gym  # lazy: only this environment needs it
    except ImportError as e:
        raise ConfigError(f"env reasoning_gym needs the reasoning-gym package, which is not installed: {INSTALL}") from e
    return reasoning_gym


def dataset_names() -> list[str]:
    """Every dataset name reasoning-gym registers (``chain_sum``, ``leg_counting``...)."""
    _reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def parse_datasets(spec: str | list[str] | tuple[str, ...]) -> list[str]:
    """Dataset names from ``"a,b"`` (the part of ``env.name`` after ``reasoning_gym:``) or a list.

    >>> parse_datasets("chain_sum, leg_counting")
    ['chain_sum', 'leg_counting']
    """
    names = spec.split(",") if isinstance(spec, str) else list(spec)
    out = list(dict.fromkeys(str(n).strip() for n in names if str(n).strip()))
    if not out:
        raise ConfigError("no reasoning-gym dataset named; use env.name: reasoning_gym:NAME[,NAME...], "
                          "e.g. reasoning_gym:chain_sum")
    return out


def split_seeds(seed: int, dataset: str) -> tuple[int, int]:
    """(test seed, train seed) of one dataset: a hash of (seed, name), and that plus 2^30.

    >>> t, r = split_seeds(0, "chain_sum"); r - t
    1073741824
    """
    test = zlib.crc32(f"agentrl-rg/{seed}/{dataset}".encode()) % _SEED_GAP
    return test, test + _SEED_GAP


def answer_is_phrases(text: str | None) -> list[str]:
    """What follows each "the answer is" / "final answer:" in ``text``, to the end of its sentence.
    (math's extraction reads one phrase per line, so several on one line would pass as one.)

    >>> answer_is_phrases("The answer is abc x. The answer is abc.")
    ['abc x', 'abc']
    """
    out = []
    for m in _ANSWER_IS.finditer(text or ""):
        rest = text[m.end():].split("\n", 1)[0]
        end = _SENTENCE_END.search(rest)
        out.append((rest[:end.start()] if end else rest).strip(" *$"))
    return out


def numbers_in(text: str) -> int:
    """How many ASCII numbers ``text`` holds (``1,234`` and ``3.5`` count once).

    >>> numbers_in("['52.2', '30.0']"), numbers_in("1,234 or 12"), numbers_in("Friday")
    (2, 2, 0)
    """
    return len(_NUMBER_RE.findall(text))


def hedge_reason(answer: str, gold: str) -> str:
    """Why ``answer`` is a hedge rather than one answer for ``gold`` ("" when it is not): more
    numbers than the gold, over twice the gold's length (+ 16), or digits the gold does not use.

    >>> hedge_reason("42 or 43", "42"), hedge_reason("42", "42"), hedge_reason("４２", "42")
    ('2 numbers where the gold has 1', '', "digits other than the gold's: ['２', '４']")
    """
    if numbers_in(answer) > numbers_in(gold):
        return f"{numbers_in(answer)} numbers where the gold has {numbers_in(gold)}"
    if len(answer) > 2 * len(gold) + 16:
        return f"{len(answer)} characters where the gold has {len(gold)}"
    odd = foreign_digits(answer) - set(gold)
    return f"digits other than the gold's: {sorted(odd)}" if odd else ""


@dataclass(frozen=True)
class _Item:
    """One generated entry and the dataset object whose scorer knows its config."""

    dataset: Any
    entry: dict[str, Any]


class ReasoningGymEnv:
    """reasoning-gym datasets, each with its own scorer; seeded, disjoint splits.

    Args:
        datasets: dataset names, ``"a,b"`` or a list (``reasoning_gym:a,b`` in ``env.name``).
        seed: fixes both splits of every dataset (same seed, same tasks).
        num_train, num_test: tasks per dataset in each split.
        configs: dataset name -> that dataset's config keys (reasoning-gym's ``*Config``
            dataclass, e.g. ``{"chain_sum": {"min_terms": 2, "max_terms": 3}}``); ``seed`` and
            ``size`` are set by the split.
        tools: ``[]`` (default) or ``["python"]``: the sandboxed python tool, for tasks a
            program solves.
        partial_credit: pass the scorer's value through (partial credit included) instead of
            1 for full marks, 0 otherwise. Not audit-safe: the default scorer gives
            ``len(gold)/len(answer)`` to any answer containing the gold.
        hedge_guard: refuse hedged answers before scoring (see the module docstring).
        system_prompt: replaces the default prompt.
    """

    name = "reasoning_gym"
    answer_pattern = ANSWER_PATTERN  # rollout.answer_pattern: a turn with none of these formats is void

    def __init__(self, datasets: str | list[str] = "chain_sum", seed: int = 0, num_train: int = 1000,
                 num_test: int = 64, configs: dict[str, dict[str, Any]] | None = None,
                 tools: list[str] | tuple[str, ...] = (), partial_credit: bool = False,
                 hedge_guard: bool = True, system_prompt: str | None = None):
        rg = _reasoning_gym()
        self.datasets = parse_datasets(datasets)
        known = dataset_names()
        for n in self.datasets:
            if n not in known:
                near = difflib.get_close_matches(n, known, n=3)
                raise ConfigError(f"unknown reasoning-gym dataset {n!r}" + (f"; did you mean {', '.join(near)}?" if near else "")
                                  + f" ({len(known)} datasets: python -c 'from reasoning_gym.factory import DATASETS; "
                                  "print(sorted(DATASETS))')")
        configs = dict(configs or {})
        if extra := sorted(set(configs) - set(self.datasets)):
            raise ConfigError(f"env.args.configs names {extra}, which env.name does not list ({self.datasets})")
        if num_train < 0 or num_test < 1:
            raise ConfigError(f"num_train={num_train}, num_test={num_test}: use num_train >= 0 and num_test >= 1")
        bad = [t for t in tools if t not in TOOLS]
        if bad:
            raise ConfigError(f"env.args.tools: unknown tool(s) {bad}; reasoning_gym offers {list(TOOLS)}")
        self.seed, self.use_tool = seed, "python" in tools
        self.partial_credit, self.hedge_guard = partial_credit, hedge_guard
        self.system_prompt = system_prompt if system_prompt is not None else \
            (SYSTEM_PROMPT_TOOL if self.use_tool else SYSTEM_PROMPT)
        self._items: dict[str, _Item] = {}
        per_split: dict[str, list[list[tuple[str, _Item]]]] = {"test": [], "train": []}
        for n in self.datasets:
            test_seed, train_seed = split_seeds(seed, n)
            test = self._draw(rg, n, configs.get(n, {}), test_seed, num_test, set())
            train = self._draw(rg, n, configs.get(n, {}), train_seed, num_train, {i.entry["question"] for i in test})
            per_split["test"].append([(n, i) for i in test])
            per_split["train"].append([(n, i) for i in train])
        self._splits = {side: self._interleave(side, lists) for side, lists in per_split.items()}

    def _draw(self, rg, name: str, config: dict[str, Any], seed: int, n: int, exclude: set[str]) -> list[_Item]:
        """``n`` items of distinct questions not in ``exclude``, from the dataset at ``seed``."""
        if not isinstance(config, dict):
            raise ConfigError(f"env.args.configs.{name} must be a mapping of {name}'s config keys, got {config!r}")
        if clash := sorted({"seed", "size"} & set(config)):
            raise ConfigError(f"env.args.configs.{name}: {clash} are set by the splits; use env.args.seed, "
                              "num_train and num_test")
        size = 2 * n + 16  # room for repeats, which are skipped
        try:
            ds = rg.create_dataset(name, seed=seed, size=size, **config)
        except TypeError as e:  # an unknown config key
            from reasoning_gym.factory import DATASETS

            cls = DATASETS[name][1]
            keys = [f.name for f in fields(cls) if f.name not in ("seed", "size")] if is_dataclass(cls) else []
            raise ConfigError(f"env.args.configs.{name}: {e}; {cls.__name__} takes {keys}") from e
        except (AssertionError, ValueError) as e:  # the config's own validate()
            raise ConfigError(f"env.args.configs.{name} is invalid: {e}") from e
        seen, out = set(exclude), []
        for i in range(size):
            if len(out) == n:
                break
            entry = ds[i]
            if entry["question"] in seen:
                continue
            seen.add(entry["question"])
            out.append(_Item(ds, entry))
        if len(out) < n:
            raise ConfigError(f"reasoning-gym dataset {name!r} gave only {len(out)} distinct questions of the {n} "
                              "asked for; lower num_train/num_test or widen its config (env.args.configs)")
        return out

    def _interleave(self, side: str, lists: list[list[tuple[str, _Item]]]) -> list[Task]:
        tasks = []
        for k in range(max(map(len, lists), default=0)):
            for one in lists:
                if k < len(one):
                    name, item = one[k]
                    task = Task(id=f"{side}-{len(tasks)}", prompt=item.entry["question"],
                                answer="" if item.entry.get("answer") is None else str(item.entry["answer"]),
                                family=name)
                    self._items[task.id] = item
                    tasks.append(task)
        return tasks

    def tools(self) -> list["Tool"]:
        if not self.use_tool:
            return []
        from agentrl.tools.python import python_tool  # lazy: the env imports without the tool

        # reasoning_gym is not among the sandbox's packages: code cannot regenerate the tasks
        return [python_tool(mode="fresh")]  # time limit: the ToolBox's (tools.timeout)

    def tasks(self, split: Split) -> list[Task]:
        return select_split(self._splits, split)

    def demonstrations(self, n: int, seed: int) -> list[list[Message]]:
        """``n`` direct answers (system, user, ``<answer>gold</answer>``) to train tasks, for
        the warm start of a model that starts from random weights (``model.path: tiny``)."""
        pool = self._splits["train"]
        if n > 0 and not pool:
            raise ValueError("demonstrations need train tasks; construct the env with num_train > 0")
        rng = random.Random(f"rg-demo-{self.seed}-{seed}")
        return [[Message("system", self.system_prompt), Message("user", t.prompt),
                 Message("assistant", f"<answer>{t.answer}</answer>")] for t in (rng.choice(pool) for _ in range(n))]

    def score(self, task: Task, messages: list[Message]) -> Score:
        item = self._items.get(task.id)
        if item is None or item.entry["question"] != task.prompt:
            raise ValueError(f"task {task.id!r} is not one of this environment's tasks (seed {self.seed}, "
                             f"datasets {self.datasets})")
        text = last_assistant_text(messages)
        got = extract_answer(text)
        if got.source == "answer_is" and len(set(answer_is_phrases(text))) > 1:
            got = Extraction(None, "ambiguous")  # "The answer is X. The answer is Y." on one line
        calls = sum(len(m.tool_calls) for m in messages if m.role == "assistant")
        info: dict[str, float | int | bool | str] = {"family": task.family, "extracted": got.text or "",
                                                     "source": got.source, "has_answer": got.text is not None,
                                                     "used_tool": calls > 0, "score": 0.0}
        if got.text is None:
            return Score(0.0, {**info, "reason": "no answer" if got.source == "none" else "several different answers"})
        if self.hedge_guard and (why := hedge_reason(got.text, task.answer)):
            return Score(0.0, {**info, "reason": f"refused: {why}"})
        try:
            raw = float(item.dataset.score_answer(got.text, item.entry))
        except Exception as e:  # a scorer tripping on the model's text: that text earns nothing
            return Score(0.0, {**info, "reason": f"the scorer raised {type(e).__name__}: {str(e)[:80]}"})
        # full marks are exactly 1.0: spell_backward sums 1/len per matching character, and an
        # answer that merely starts with the gold reaches 1.0000000000000002 for 9 letters
        full = raw == 1.0
        reward = min(1.0, max(0.0, raw)) if self.partial_credit else float(full)
        return Score(reward, {**info, "score": raw, "reason": "full marks" if full else f"scorer gave {raw:g}"})

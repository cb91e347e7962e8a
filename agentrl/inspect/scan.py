"""One streaming pass over the rollout files: summary rows, the selected trajectories, problems.

Memory is O(shown trajectories + groups per file): every line is parsed, counted in the
summary, tested against the filters, and dropped unless it is kept for showing. With
``pick="spread"`` only a small key per match is kept (reward, advantage, group, a digest)
and the chosen lines are read again from their files.

A selection picks from one kind of rollouts (training, or evaluation: see filters.py);
``read_all`` reads the other files too, for the summary table only.

Example::

    import tempfile, pathlib
    from agentrl.types import Span, Trajectory, Verdict
    d = pathlib.Path(tempfile.mkdtemp())
    t = Trajectory([1, 2], 1, [0, 1], [0.0, -0.2], [Span(0, 1, "prompt"), Span(1, 2, "model")], [],
                   verdict=Verdict(1.0), group_id="g")
    (d / "step_000001.jsonl").write_text((t.to_json() + "\\n") * 5)
    (d / "eval_step_000001.jsonl").write_text(t.to_json() + "\\n")
    res = scan(find_sources(str(d)), Selection(limit=2))
    assert res.matched == 5 and len(res.selected) == 2 and res.rows[0].attempts == 5
    assert res.scope == "training step 1" and not res.selected[0].evaluation
    res = scan(find_sources(str(d)), Selection(evaluation=True, read_all=True))
    assert res.matched == 1 and res.selected[0].evaluation and len(res.rows) == 2
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.inspect.filters import Selection
from agentrl.inspect.loader import Problem, Record, iter_file
from agentrl.inspect.sources import RolloutFile, Sources, find_sources  # noqa: F401 (doc example)
from agentrl.inspect.summary import SummaryAccumulator, SummaryRow
from agentrl.types import EVAL_GROUP_PREFIX

MAX_KEPT_PROBLEMS = 200
_HINT_GROUPS = 5


@dataclass
class ScanResult:
    """What one pass found. ``problems`` keeps the first MAX_KEPT_PROBLEMS of ``problem_count``."""

    rows: list[SummaryRow]
    selected: list[Record]
    matched: int  # trajectories that passed the filters (before index/limit)
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    group_hint: list[str] = field(default_factory=list)  # some group ids seen, for "no match" help
    scope: str = ""  # which rollouts the selection picked from, e.g. "training step 30"
    evaluation: bool = False  # the selection picked from evaluation rollouts
    other_kind: bool = False  # the PATH also holds the other kind (training vs evaluation)
    more_steps: bool = False  # files of this kind that the selection did not pick from
    picked: str = ""  # how ``selected`` was chosen among more matches ("" = the first, in file order)


def selection_kind(sources: Sources, selection: Selection) -> bool:
    """True when the selection reads evaluation rollouts: asked for, or the PATH has no training file."""
    if selection.evaluation is not None:
        return selection.evaluation
    return bool(sources.files) and all(f.evaluation for f in sources.files)


def files_for(sources: Sources, selection: Selection) -> list[RolloutFile]:
    """The files a selection picks from: one kind; all, one step, or the last step (``--step last``)."""
    evaluation = selection_kind(sources, selection)
    files = [f for f in sources.files if f.evaluation == evaluation]
    if selection.last_step:
        stepped = [f for f in files if f.step is not None]
        if stepped:
            return stepped[-1:]
        return files if selection.read_all else files[-1:]  # no numbered file: the default view reads all
    # Unnumbered files are read too: their lines may carry metadata["step"].
    return [f for f in files if f.step is None or selection.wants_step(f.step)]


def describe_scope(files: list[RolloutFile], evaluation: bool) -> str:
    """``training step 30``, ``eval @ step 5``, ``training rollouts, steps 1–30``, ..."""
    steps = sorted({f.step for f in files if f.step is not None})
    if len(files) == 1 and steps:
        return f"eval @ step {steps[0]}" if evaluation else f"training step {steps[0]}"
    what = "evaluation rollouts" if evaluation else "training rollouts"
    if len(steps) > 1:
        return f"{what}, steps {steps[0]}–{steps[-1]}"
    return what


def record_step(f: RolloutFile, metadata: dict) -> int | None:
    """A trajectory's step: from its file name, else from ``metadata["step"]``."""
    if f.step is not None:
        return f.step
    step = metadata.get("step")
    return step if isinstance(step, int) else None


def _annotate(item: Record, f: RolloutFile) -> Record:
    t = item.trajectory
    item.step = record_step(f, t.metadata)
    item.evaluation = f.evaluation or t.group_id.startswith(EVAL_GROUP_PREFIX)
    return item


@dataclass(frozen=True)
class MatchKey:
    """What ``spread_picks`` needs of a match; the trajectory itself is read again later."""

    pos: int  # among the matches, in file order
    path: Path
    line: int
    reward: float | None
    advantage: float | None
    group: str
    digest: int  # hash of the token ids: identical attempts are never both picked


def _rank_score(k: MatchKey) -> tuple[float, float]:
    r = -math.inf if k.reward is None or math.isnan(k.reward) else k.reward
    a = k.advantage if k.advantage is not None and not math.isnan(k.advantage) else 0.0
    return (r, a)


def spread_picks(keys: list[MatchKey], k: int) -> list[MatchKey]:
    """Up to ``k`` matches spread over the reward range: highest, (quantiles,) lowest.

    Ranked by (reward, advantage), highest first; each pick is the match nearest its target
    rank from a group not picked yet, else one with other tokens, else any. Returned best first.

    >>> ks = [MatchKey(i, Path("f"), i + 1, r, 0.0, g, hash((g, i))) for i, (r, g) in
    ...       enumerate([(1, "a"), (1, "a"), (1, "a"), (0, "b"), (0.5, "c"), (0, "a")])]
    >>> [(p.reward, p.group) for p in spread_picks(ks, 3)]
    [(1, 'a'), (0.5, 'c'), (0, 'b')]
    """
    n = len(keys)
    if n <= k:
        return list(keys)
    ranked = sorted(keys, key=_rank_score, reverse=True)  # stable: ties stay in file order
    targets = [0] if k == 1 else [round(j * (n - 1) / (k - 1)) for j in range(k)]
    order = targets[:1] + targets[-1:] + targets[1:-1] if k > 1 else targets  # extremes first
    used: set[int] = set()
    groups: set[str] = set()
    digests: set[int] = set()
    for target in order:
        for strict in (2, 1, 0):
            r = _nearest(target, n, lambda i: i not in used
                         and (strict < 1 or ranked[i].digest not in digests)
                         and (strict < 2 or ranked[i].group not in groups))
            if r is not None:
                used.add(r)
                groups.add(ranked[r].group)
                digests.add(ranked[r].digest)
                break
    return [ranked[i] for i in sorted(used)]


def _nearest(target: int, n: int, ok) -> int | None:
    for d in range(n):
        for i in (target + d, target - d) if d else (target,):
            if 0 <= i < n and ok(i):
                return i
    return None


def _describe_picks(k: int) -> str:
    if k == 1:
        return "the highest reward"
    if k == 2:
        return "the highest and lowest reward, from distinct groups"
    if k == 3:
        return "the highest, median and lowest reward, from distinct groups"
    return f"{k} spread from the highest to the lowest reward, from distinct groups"


def _read_picks(picks: list[MatchKey], files: dict[Path, RolloutFile]) -> list[Record]:
    wanted: dict[Path, set[int]] = {}
    for p in picks:
        wanted.setdefault(p.path, set()).add(p.line)
    found: dict[tuple[Path, int], Record] = {}
    for path, lines in wanted.items():
        f = files[path]
        for item in iter_file(f):
            if isinstance(item, Record) and item.line in lines:
                found[(path, item.line)] = _annotate(item, f)
    return [found[(p.path, p.line)] for p in picks if (p.path, p.line) in found]


def scan(sources: Sources, selection: Selection) -> ScanResult:
    """Read every selected file line by line; keep only what will be shown."""
    evaluation = selection_kind(sources, selection)
    chosen = files_for(sources, selection)
    pickable = {f.path for f in chosen}
    res = ScanResult(rows=[], selected=[], matched=0, scope=describe_scope(chosen, evaluation),
                     evaluation=evaluation, other_kind=any(f.evaluation != evaluation for f in sources.files),
                     more_steps=sum(f.evaluation == evaluation for f in sources.files) > len(chosen))
    spread = selection.pick == "spread" and selection.index is None
    keys: list[MatchKey] = []
    for f in sources.files if selection.read_all else chosen:
        acc = SummaryAccumulator(f.label, evaluation=f.evaluation)
        for item in iter_file(f):
            if isinstance(item, Problem):
                res.problem_count += 1
                acc.problems += 1
                if len(res.problems) < MAX_KEPT_PROBLEMS:
                    res.problems.append(item)
                continue
            t = _annotate(item, f).trajectory
            acc.add(t)
            if f.path not in pickable:
                continue
            if len(res.group_hint) < _HINT_GROUPS and t.group_id not in res.group_hint:
                res.group_hint.append(t.group_id)
            if not selection.matches(t, step=item.step):
                continue
            pos = res.matched
            res.matched += 1
            if selection.index is not None and pos != selection.index:
                continue
            if spread:
                keys.append(MatchKey(pos, f.path, item.line, t.reward, t.advantage, t.group_id,
                                     hash(tuple(t.token_ids))))
            if len(res.selected) < selection.limit:
                res.selected.append(item)
        res.rows.append(acc.row())
    if spread and res.matched > selection.limit:
        res.selected = _read_picks(spread_picks(keys, selection.limit), {f.path: f for f in chosen})
        res.picked = _describe_picks(len(res.selected))
    return res


def showing_text(res: ScanResult) -> str:
    """``3 of 128 matching trajectories from training step 30 (how they were picked)``."""
    text = f"{len(res.selected)} of {res.matched} matching trajectories"
    if res.scope:
        text += f" from {res.scope}"
    return text + (f" ({res.picked})" if res.picked else "")


def other_views_hint(res: ScanResult) -> str:
    """Where the rest is: other steps, and the other kind (training vs evaluation)."""
    hints = ["--step N or --step all: other steps"] if res.more_steps else []
    if res.other_kind:
        hints.append("drop --eval: the training rollouts" if res.evaluation
                     else "--eval: the evaluation rollouts (never trained)")
    return " · ".join(hints)


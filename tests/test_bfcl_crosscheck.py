"""agentrl's BFCL checker gives BFCL's own verdict on every recorded case.

tests/fixtures/bfcl_crosscheck.jsonl holds perturbed model outputs (right answers written
differently, wrong values and types, missing and extra arguments, wrong names, reordered or
dropped parallel calls, calls for irrelevance questions, hand-made quirk cases) with the verdict
of BFCL's evaluation pipeline (bfcl-eval 2026.3.23), recorded by benchmarks/bfcl_crosscheck.py.
Replaying it needs neither BFCL nor its dependencies.
"""

from __future__ import annotations

import collections
import json

from agentrl.envs.bfcl_check import check
from fixture_paths import FIXTURES

FIXTURE = FIXTURES / "bfcl_crosscheck.jsonl"


def _load():
    rows = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line.strip()]
    tasks = {r["id"]: r for r in rows if r["kind"] == "task"}
    cases = [r for r in rows if r["kind"] == "case"]
    return rows[0], tasks, cases


def test_every_recorded_bfcl_verdict_is_reproduced():
    meta, tasks, cases = _load()
    assert meta["bfcl"].startswith("bfcl eval_runner")  # recorded with BFCL's own pipeline
    wrong = []
    for case in cases:
        task = tasks[case["task"]]
        got = check(task["category"], task["function"], task["possible_answer"], [tuple(c) for c in case["calls"]])
        if got.valid != case["bfcl"]:
            wrong.append(f"{case['case']} ({case['perturbation']}): BFCL {case['bfcl']} {case['bfcl_error_type']}, "
                         f"agentrl {got.valid} {got.error_type}")
    assert not wrong, "\n".join(wrong[:20])


def test_the_fixture_covers_every_category_and_both_verdicts():
    _, tasks, cases = _load()
    assert len(cases) >= 1000
    per = collections.Counter((tasks[c["task"]]["category"], c["bfcl"]) for c in cases)
    for category in ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"):
        assert per[(category, True)] >= 20 and per[(category, False)] >= 20, (category, per)
    kinds = {c["perturbation"] for c in cases}
    assert {"gold", "string_variant", "int_for_float", "reordered", "wrong_number", "number_as_string",
            "missing_required", "extra_unknown_param", "wrong_name", "no_call", "synthetic"} <= kinds

"""agentrl's BFCL checker gives BFCL's own verdict on every recorded case.

tests/fixtures/bfcl_crosscheck.jsonl holds perturbed model outputs (right answers written
differently, wrong values and types, missing and extra arguments, wrong names, reordered or
dropped parallel calls, calls for irrelevance questions, hand-made quirk cases) with the verdict
of BFCL's evaluation pipeline (bfcl-eval 2026.3.23), recorded by benchmarks/bfcl_crosscheck.py.
Replaying it needs neither BFCL nor its dependencies.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.envs.bfcl_check import check
from fixture_paths import FIXTURES

FIXTURE = FIXTURES / "bfcl_crosscheck.jsonl"
ROOT = Path(__file__).resolve().parents[1]


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


@pytest.mark.skipif(importlib.util.find_spec("bfcl_eval") is None,
                    reason="bfcl-eval is not installed (pip install --no-deps bfcl-eval==2026.3.23)")
def test_fresh_cases_agree_with_bfcls_ast_checker_imported_alone():
    """New cases (another seed) against BFCL's ast_checker itself, which a --no-deps install
    can import with its model registry stubbed (benchmarks/bfcl_crosscheck.py)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bfcl_crosscheck.py"), "--seed", "7",
                           "--tasks-per-category", "8"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "model registry stubbed" in proc.stdout
    n = int(proc.stdout.split("agreement: ")[1].split("/")[1].split()[0])
    assert n > 200 and f"agreement: {n}/{n}" in proc.stdout, proc.stdout[-3000:]

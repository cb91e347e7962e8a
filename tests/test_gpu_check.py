"""benchmarks/gpu_check: the one-command GPU acceptance check (issue 20), kept from rotting in CI.

The slow test runs the whole check with ``--smoke`` on CPU (tiny sizes, the same code paths:
bf16 through FSDP2 on a one-rank group, the Qwen2.5 tokenizer, the python tool without
bubblewrap) with the modules the GPU machine lacks hidden, and checks the JSON report: every
section present with status ok and sane figures. The fast tests pin the parts the smoke run
cannot falsify on its own: the jsonschema stand-in agrees with jsonschema, the trajectory
checks catch broken masks and spans, and the report survives its JSON round trip.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Literal, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_check import jsonschema_lite  # noqa: E402
from gpu_check.checks import logprob_match, trajectory_problems  # noqa: E402
from gpu_check.results import Meta, Report, SectionResult, UpdateData, UpdateRow, from_dict  # noqa: E402
from gpu_check.sections import SECTIONS as DECLARED  # noqa: E402  (registers each section's data class)

SECTIONS = ["setup", "sampling_tiny", "sampling_qwen", "train_step", "logprob_match", "masks_spans", "update",
            "arithmetic"]


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.mark.slow
def test_smoke_run_reports_every_section_ok(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check"), str(out), "--smoke",
                           "--work", str(work)], capture_output=True, text=True, timeout=880, cwd=REPO)
    report = json.loads((out / "gpu_check.json").read_text())
    by = {s["name"]: s for s in report["sections"]}
    logs = {p.name: p.read_text()[-3000:] for p in (out / "logs").glob("*.log")}
    assert [s.name for s in DECLARED] == SECTIONS
    assert list(by) == SECTIONS, proc.stdout[-3000:]
    bad = {n: (s["status"], s["error"]) for n, s in by.items() if s["status"] != "ok"}
    assert not bad, f"{bad}\n{logs}"
    assert proc.returncode == 0
    assert report["meta"]["profile"] == "smoke" and report["meta"]["wall_s"] <= report["meta"]["total_budget_s"]

    setup = by["setup"]["data"]
    assert setup["imports"]["agentrl_file"].startswith(str(REPO))
    assert setup["imports"]["mapped_packages"]["agentrl.tools"] == str(REPO / "tools")
    assert "jsonschema" in setup["imports"]["hidden"]  # run as the GPU machine would see it
    assert any("jsonschema_lite" in n for n in by["setup"]["notes"])
    assert setup["vocab_size"] == 151936 and setup["tokenizer_len"] == 151665  # Qwen2.5's, from the fixture

    for name in ("sampling_tiny", "sampling_qwen"):
        rows = by[name]["data"]["rows"]
        assert {(r["batch"], r["path"]) for r in rows} == {(b, p) for b in (4, 8) for p in ("engine", "generate")}
        assert all(_finite_positive(r["tokens_per_s"]) and _finite_positive(r["seconds"]) for r in rows)

    steps = by["train_step"]["data"]["steps"]
    assert [s["kind"] for s in steps] == ["free", "scripted-tools"]
    assert steps[1]["tool_calls_per_traj"] > 0 and all(_finite_positive(s["step_s"]) for s in steps)
    assert by["train_step"]["data"]["isolation_level"] in ("unshare", "rlimits")

    lp = by["logprob_match"]["data"]
    assert lp["tokens"] > 0 and lp["max_abs"] <= lp["tol_max"] and lp["mean_abs"] <= lp["tol_mean"]
    assert lp["shifted_mean_abs"] > 5 * lp["tol_mean"]  # the check can see misaligned tokens

    masks = by["masks_spans"]["data"]
    assert masks["problems_found"] == [] and masks["with_tool_calls"] > 0
    assert {"prompt", "model", "tool", "template"} <= set(masks["span_tokens"])

    rows = by["update"]["data"]["rows"]
    assert [(r["grad_checkpointing"], r["checkpointing_active"]) for r in rows] == [(True, True), (False, False)]
    assert all(_finite_positive(r["us_per_trained_token"]) and r["trained_tokens"] > 0 for r in rows)

    arith = by["arithmetic"]["data"]
    assert arith["steps_done"] == arith["steps_asked"] == 2
    assert 0.0 <= arith["accuracy_before"] <= 1.0 and 0.0 <= arith["accuracy_after"] <= 1.0

    table = (out / "gpu_check.md").read_text()
    assert all(f"| {n} | ok |" in table for n in SECTIONS)


PLAIN_CHECKOUT = '''
import json, sys
# as on the GPU machine: no (editable) install of agentrl, and none of the modules it lacks
sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("__editable__")]
sys.path.insert(0, sys.argv[1])
from gpu_check import bootstrap
report = bootstrap.prepare(list(bootstrap.GPU_ABSENT))
from importlib import resources
from agentrl import tool
from agentrl.tools import python_tool
from agentrl.envs.arithmetic import ArithmeticEnv

@tool
def add(a: int, b: int = 1) -> int:
    """Add.

    Args:
        a: first
        b: second
    """
    return a + b

print(json.dumps({"agentrl": report.agentrl_file, "mapped": report.mapped_packages,
                  "jsonschema": sys.modules["jsonschema"].__name__, "errors": add.argument_errors({"a": "x", "c": 1}),
                  "template": len(resources.files("agentrl.templates").joinpath("hermes_compact.jinja").read_text()),
                  "env": type(ArithmeticEnv(seed=0)).__module__, "tool": python_tool.__module__}))
'''


def test_bootstrap_imports_the_working_tree_without_an_install(tmp_path):
    proc = subprocess.run([sys.executable, "-c", PLAIN_CHECKOUT, str(REPO / "benchmarks")], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["agentrl"] == str(REPO / "agentrl" / "__init__.py")
    assert got["mapped"] == {"agentrl.envs": str(REPO / "envs"), "agentrl.templates": str(REPO / "templates"),
                             "agentrl.tools": str(REPO / "tools")}
    assert got["jsonschema"] == "gpu_check.jsonschema_lite"
    assert got["errors"] == ["argument 'a' must be integer, got string \"x\"", "unexpected argument 'c'"]
    assert got["template"] > 0 and got["env"] == "agentrl.envs.arithmetic" and got["tool"] == "agentrl.tools.python"


def _tool_fn(count: int, ratio: float, name: str, flag: bool, ids: list[int], weights: dict[str, int],
             mode: Literal["fast", "slow"] = "fast", limit: Optional[int] = None) -> str:
    """A function with every kind of parameter agentrl turns into a schema.

    Args:
        count: an integer
        ratio: a number
        name: a string
        flag: a boolean
        ids: integers
        weights: integer values
        mode: one of two
        limit: an integer or null
    """
    return ""


ARGUMENTS = [
    {"count": 1, "ratio": 0.5, "name": "a", "flag": True, "ids": [1, 2], "weights": {"x": 1}},
    {"count": 3.0, "ratio": 1, "name": "a", "flag": False, "ids": [], "weights": {}, "mode": "slow", "limit": None},
    {"count": "3", "ratio": True, "name": 5, "flag": 1, "ids": [1, "2"], "weights": {"x": "y"}},
    {"ratio": 0.5, "extra": 1, "other": 2},
    {"count": 1, "ratio": 0.5, "name": "a", "flag": True, "ids": [1], "weights": {}, "mode": "medium", "limit": "9"},
    {},
]


@pytest.mark.parametrize("arguments", ARGUMENTS)
def test_jsonschema_stand_in_gives_the_messages_of_jsonschema(arguments):
    jsonschema = pytest.importorskip("jsonschema")
    from agentrl.toolbox.schema import argument_errors, function_schema

    schema = function_schema(_tool_fn, skip=set()).parameters
    jsonschema_lite.Draft202012Validator.check_schema(schema)
    real = argument_errors(jsonschema.Draft202012Validator(schema), arguments)
    lite = argument_errors(jsonschema_lite.Draft202012Validator(schema), arguments)
    assert lite == real


def _trajectory():
    from agentrl import Span, Trajectory
    from agentrl.types import ToolCallRecord, TrainerMarks

    ids = [1, 2, 3, 10, 11, 12, 20, 21, 30, 31]
    return Trajectory(
        token_ids=ids, prompt_len=3, loss_mask=[0, 0, 0, 1, 1, 1, 0, 0, 0, 0],
        logprobs=[0, 0, 0, -1.0, -2.0, -0.5, 0, 0, 0, 0],
        trained=TrainerMarks(old_logprobs=[0, 0, 0, -1.0, -2.0, -0.5, 0, 0, 0, 0]),
        spans=[Span(0, 3, "prompt"), Span(3, 6, "model"), Span(6, 8, "template"), Span(8, 10, "tool")],
        messages=[], tool_calls=[ToolCallRecord("python", {"code": "print(42)"}, "42", None, 0.01, 0)])


def test_trajectory_checks_pass_a_sound_trajectory_and_catch_each_break():
    decode = {30: "4", 31: "2"}

    def text(ids):
        return "".join(decode.get(i, "?") for i in ids)

    sound = _trajectory()
    assert trajectory_problems(sound, [1, 2, 3], text) == []
    broken = {
        "mask": replace(sound, loss_mask=[0, 0, 0, 1, 1, 1, 1, 0, 0, 0]),
        "gap": replace(sound, spans=[sound.spans[0], sound.spans[1], sound.spans[3]]),
        "prompt": sound,  # checked against another rendering below
        "logprob": replace(sound, logprobs=[0, 0, -0.1, -1.0, -2.0, -0.5, 0, 0, 0, 0]),
        "tool": replace(sound, token_ids=sound.token_ids[:8] + [31, 30]),
    }
    for what, t in broken.items():
        expected = [1, 2, 4] if what == "prompt" else [1, 2, 3]
        assert trajectory_problems(t, expected, text), what


def test_logprob_match_measures_the_gap_and_its_shifted_control():
    t = _trajectory()
    t.trained.old_logprobs = [x + (0.01 if m else 0.0) for x, m in zip(t.logprobs, t.loss_mask)]
    data = logprob_match([t], "bfloat16", (0.02, 0.15))
    assert data.tokens == 3 and abs(data.mean_abs - 0.01) < 1e-9 and data.problems() == []
    assert abs(data.shifted_mean_abs - (abs(-1.0 - -1.99) + abs(-2.0 - -0.49)) / 2) < 1e-9
    t.trained.old_logprobs = [x + (0.5 if m else 0.0) for x, m in zip(t.logprobs, t.loss_mask)]
    assert any("max" in p for p in logprob_match([t], "bfloat16", (0.02, 0.15)).problems())


def test_report_round_trips_through_json():
    row = UpdateRow(grad_checkpointing=True, checkpointing_active=True, seconds=1.5, trained_tokens=10,
                    sequence_tokens=20, us_per_trained_token=1.5e5, us_per_sequence_token=7.5e4)
    report = Report(Meta("cmd", "smoke", "now", "abc", False, 10.0),
                    [SectionResult("update", "ok", 2.0, 60.0, data=UpdateData("fsdp", 1024, [row]))])
    back = from_dict(Report, json.loads(json.dumps(asdict(report))))
    assert back == report and isinstance(back.sections[0].data.rows[0], UpdateRow)
    assert "| update | ok |" in back.markdown()

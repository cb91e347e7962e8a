"""Cross-check agentrl's BFCL checker (envs/bfcl_check.py) against BFCL's own.

Builds model outputs by perturbing BFCL's possible answers (right answers, right answers
written differently, wrong values, wrong types, missing or extra arguments, wrong function
names, reordered, dropped or repeated parallel calls, calls for irrelevance questions...),
asks BFCL's evaluation code for its verdict on each, asks agentrl's checker, and prints the
agreement and every disagreement. ``--out`` records the cases and BFCL's verdicts
(tests/fixtures/bfcl_crosscheck.jsonl), which tests/test_bfcl_crosscheck.py replays on every
CI run without BFCL's dependencies.

BFCL's side runs in an interpreter of your choice (``--bfcl-python``). With bfcl-eval installed
with its dependencies there (``python3 -m venv /tmp/bfcl-venv && /tmp/bfcl-venv/bin/pip install
bfcl-eval==2026.3.23 soundfile``; soundfile is a dependency its qwen-agent import forgets) the
verdicts come from BFCL's own pipeline: ``eval_runner._evaluate_single_ast_entry`` and
``_evaluate_single_relevance_entry`` with the OpenAI function-calling handler of
``gpt-4o-2024-11-20-FC`` (its ``decode_ast``, its ``underscore_to_dot``), each call's arguments
handed over as the JSON text an API returns. Without one (a ``--no-deps`` install) the
current interpreter imports ``ast_checker`` alone, with BFCL's model registry stubbed, and
repeats the runner's decoding steps. A run records which one it used.

    python benchmarks/bfcl_crosscheck.py --bfcl-python /tmp/bfcl-venv/bin/python \\
        --out tests/fixtures/bfcl_crosscheck.jsonl
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import random
import subprocess
import sys
from pathlib import Path

AST_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
MODEL = "gpt-4o-2024-11-20-FC"  # an OpenAI function-calling model: dots in names become "_"
NO_CALL_TEXT = "I cannot answer this with the functions I have."


# -- BFCL's side (runs in the interpreter that has bfcl_eval; imports nothing of agentrl) ----------


def bfcl_side() -> None:
    """Read {"tasks", "cases"} on stdin, write one verdict per case on stdout."""
    job = json.load(sys.stdin)
    judge, mode = _bfcl_judge()
    out = []
    for case in job["cases"]:
        task = job["tasks"][case["task"]]
        # what an OpenAI FC handler stores: [{name: arguments JSON}], or the text of a reply without calls
        item = [{name: json.dumps(args)} for name, args in case["calls"]] if case["calls"] else NO_CALL_TEXT
        try:
            valid, error_type = judge(task, item)
        except Exception as e:  # BFCL itself raised: recorded, never counted as agreement
            valid, error_type = None, f"crash:{type(e).__name__}: {e}"
        out.append({"valid": valid, "error_type": error_type})
    json.dump({"mode": mode, "verdicts": out}, sys.stdout)


def _bfcl_judge():
    os.environ.setdefault("OPENAI_API_KEY", "unused")  # the handler builds a client it never calls
    try:
        from bfcl_eval.constants.enums import Language, ReturnFormat
        from bfcl_eval.eval_checker import eval_runner

        handler = eval_runner.get_handler(MODEL)

        def judge(task, item):
            prompt = {"id": task["id"], "question": task["question"], "function": task["function"]}
            if task["category"] == "irrelevance":
                r = eval_runner._evaluate_single_relevance_entry(handler, task["id"], item, prompt, MODEL, "irrelevance")
            else:
                r = eval_runner._evaluate_single_ast_entry(handler, task["id"], item, task["possible_answer"], prompt,
                                                           MODEL, task["category"], Language.PYTHON,
                                                           ReturnFormat.PYTHON, False)
            return r["valid"], r.get("error_type", "")

        return judge, "bfcl eval_runner (full install)"
    except ImportError:
        return _stub_judge(), "bfcl ast_checker (model registry stubbed)"


def _stub_judge():
    import types
    from dataclasses import dataclass

    @dataclass
    class _Config:
        underscore_to_dot: bool = True

    registry = types.ModuleType("bfcl_eval.constants.model_config")
    registry.MODEL_CONFIG_MAPPING = collections.defaultdict(_Config)
    sys.modules["bfcl_eval.constants.model_config"] = registry
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output

    def judge(task, item):
        # the FC handler's decode_ast: [{name: json.loads(arguments)}]; a text reply fails to decode
        decoded = [{n: json.loads(a) for n, a in call.items()} for call in item] if isinstance(item, list) else None
        if task["category"] == "irrelevance":
            ok = decoded is None or is_empty_output(decoded)
            return ok, "" if ok else "irrelevance_error:decoder_success"
        if decoded is None:
            return False, "ast_decoder:decoder_failed"
        if not is_function_calling_format_output(decoded):
            return False, "ast_decoder:decoder_wrong_output_format"
        r = ast_checker(task["function"], decoded, task["possible_answer"], Language.PYTHON, task["category"], MODEL)
        return r["valid"], r.get("error_type", "")

    return judge


# -- the cases -----------------------------------------------------------------------------


def _dotless(name: str) -> str:  # the name a function is offered under
    return name.replace(".", "_")


def _real(options: list) -> list:  # the possible values, less the optional marker
    return [o for o in options if o != ""]


def _materialise(value, prop: dict, rng: random.Random):
    """A concrete value from one possible value (a possible dict holds possible values per key)."""
    if prop.get("type") == "dict" and isinstance(value, dict):
        return {k: rng.choice(_real(v)) for k, v in value.items()
                if _real(v) and not ("" in v and rng.random() < 0.3)}
    if prop.get("type") == "array" and prop.get("items", {}).get("type") == "dict" and isinstance(value, list):
        return [_materialise(v, {"type": "dict"}, rng) for v in value]
    return value


def gold_call(fn: dict, answer: dict, rng: random.Random, first: bool) -> list:
    """A call the answer accepts: the first (or a random) possible value of each parameter,
    optional ones sometimes left out."""
    name, options = next(iter(answer.items()))
    props, required = fn["parameters"]["properties"], fn["parameters"].get("required", [])
    args = {}
    for p, opts in options.items():
        if not _real(opts) or (not first and "" in opts and p not in required and rng.random() < 0.4):
            continue
        args[p] = _materialise(_real(opts)[0] if first else rng.choice(_real(opts)), props.get(p, {}), rng)
    return [_dotless(name), args]


def _find(functions: list[dict], name: str) -> dict:
    return next(f for f in functions if f["name"] == name)


def _sample_value(prop: dict):
    return {"integer": 3, "float": 2.5, "boolean": True, "array": [], "tuple": [], "dict": {}}.get(prop.get("type"), "x")


def call_mutations(call: list, fn: dict, answer: dict, functions: list[dict]) -> dict[str, list]:
    """Every applicable one-call perturbation: name -> the perturbed call."""
    name, args = call
    props = fn["parameters"]["properties"]
    required = fn["parameters"].get("required", [])
    options = next(iter(answer.values()))
    out: dict[str, list] = {}

    def with_arg(p, v):
        return [name, {**args, p: v}]

    for p, v in args.items():
        kind = props.get(p, {}).get("type")
        if kind == "string" and isinstance(v, str) and v and "string_variant" not in out:
            out["string_variant"] = with_arg(p, v.upper().replace(" ", ", ") + ".")
        if kind == "string" and isinstance(v, str) and "wrong_string" not in out:
            out["wrong_string"] = with_arg(p, v + " zz")
        if kind == "float" and type(v) is float and v.is_integer() and "int_for_float" not in out:
            out["int_for_float"] = with_arg(p, int(v))
        if kind == "integer" and type(v) is int:
            out.setdefault("float_for_int", with_arg(p, float(v)))
            out.setdefault("bool_for_int", with_arg(p, True))
        if kind in ("integer", "float") and type(v) in (int, float):
            out.setdefault("number_as_string", with_arg(p, str(v)))
            out.setdefault("wrong_number", with_arg(p, v + 1))
        item_kind = props.get(p, {}).get("items", {}).get("type")
        if item_kind == "float" and isinstance(v, list) and v and all(type(x) is float and x.is_integer() for x in v):
            out.setdefault("int_items_for_float_list", with_arg(p, [int(x) for x in v]))
        if item_kind == "string" and isinstance(v, list) and v and all(isinstance(x, str) for x in v):
            out.setdefault("list_string_variant", with_arg(p, [x.title() + " " for x in v]))
        if kind == "dict" and isinstance(v, dict) and any(isinstance(x, str) for x in v.values()):
            out.setdefault("dict_string_variant", with_arg(p, {k: x.upper() if isinstance(x, str) else x
                                                              for k, x in v.items()}))
        if kind in ("array", "tuple") and "" in options.get(p, []):
            out.setdefault("empty_list_for_optional", with_arg(p, []))
        if kind == "boolean" and type(v) is bool:
            out.setdefault("flipped_bool", with_arg(p, not v))
        if kind in ("array", "tuple") and isinstance(v, list) and len(set(map(json.dumps, v))) > 1:
            out.setdefault("list_reversed", with_arg(p, v[::-1]))
        if kind in ("array", "tuple") and isinstance(v, list) and v:
            out.setdefault("list_extra_item", with_arg(p, v + v[:1]))
        if kind == "dict" and isinstance(v, dict) and v:
            out.setdefault("dict_key_dropped", with_arg(p, dict(list(v.items())[1:])))
            out.setdefault("dict_extra_key", with_arg(p, {**v, "zz_key": 1}))
        out.setdefault("null_value", with_arg(p, None))
        dropped = [name, {k: x for k, x in args.items() if k != p}]
        if p in required:
            out.setdefault("missing_required", dropped)
        elif "" in options.get(p, []):
            out.setdefault("omitted_optional", dropped)
        else:
            out.setdefault("missing_unmarked_optional", dropped)
    out["extra_unknown_param"] = [name, {**args, "zz_unknown": 1}]
    known = [p for p in props if p not in options]
    if known:
        out["extra_known_param"] = [name, {**args, known[0]: _sample_value(props[known[0]])}]
    if "." in fn["name"]:
        out["dotted_name"] = [fn["name"], args]
    out["wrong_name"] = [name + "_v2", args]
    others = [f for f in functions if f["name"] != fn["name"]]
    if others:
        out["other_function"] = [_dotless(others[0]["name"]), args]
    return out


def task_cases(task: dict, rng: random.Random, per_task: int) -> list[tuple[str, list]]:
    """(perturbation, calls) pairs for one task."""
    functions, answers = task["function"], task["possible_answer"]
    if task["category"] == "irrelevance":
        fn = functions[0]
        call = [_dotless(fn["name"]), {p: _sample_value(v) for p, v in fn["parameters"]["properties"].items()
                                        if p in fn["parameters"].get("required", [])}]
        return [("no_call", []), ("call_offered_function", [call]), ("two_calls", [call, call])]
    gold = [gold_call(_find(functions, next(iter(a))), a, rng, first=True) for a in answers]
    cases = [("gold", gold), ("gold_random", [gold_call(_find(functions, next(iter(a))), a, rng, first=False)
                                              for a in answers])]
    pool: list[tuple[str, list]] = [("no_call", []), ("extra_call", gold + gold[:1])]
    if len(gold) > 1:
        pool += [("reordered", gold[::-1]), ("dropped_call", gold[:-1]),
                 ("shuffled", rng.sample(gold, len(gold))), ("repeated_call", gold[:1] * len(gold))]
    k = rng.randrange(len(gold))  # one call of the list is perturbed
    fn = _find(functions, next(iter(answers[k])))
    for label, call in call_mutations(gold[k], fn, answers[k], functions).items():
        pool.append((label, [*gold[:k], call, *gold[k + 1:]]))
    rare = [c for c in pool if c[0] in RARE]  # applicable to few tasks: always taken
    common = [c for c in pool if c[0] not in RARE]
    return cases + rare + rng.sample(common, max(0, min(per_task - len(rare), len(common))))


# perturbations that few tasks allow, so a sample would rarely draw them
RARE = {"int_for_float", "int_items_for_float_list", "list_string_variant", "dict_string_variant",
        "empty_list_for_optional", "list_reversed", "dict_key_dropped", "dict_extra_key", "reordered", "flipped_bool"}


def _fn(name: str, props: dict, required: list[str]) -> dict:
    return {"name": name, "parameters": {"type": "dict", "properties": props, "required": required}}


# Hand-made tasks for BFCL's quirks (docs/bfcl.md): (category, functions, possible answer, [calls...])
SYNTHETIC = [
    # greedy parallel matching: the first answer takes the first call it accepts
    ("parallel", [_fn("f", {"x": {"type": "integer"}}, ["x"])], [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}],
     [[["f", {"x": 1}], ["f", {"x": 2}]], [["f", {"x": 2}], ["f", {"x": 1}]]]),
    # a "variable": possible values of another type than the parameter's, compared exactly
    ("simple_python", [_fn("g", {"n": {"type": "integer"}}, ["n"])], [{"g": {"n": ["size"]}}],
     [[["g", {"n": "size"}]], [["g", {"n": "Size"}]], [["g", {"n": 5}]]]),
    # "" stands for the empty list; list items normalised; order matters
    ("simple_python", [_fn("h", {"xs": {"type": "array", "items": {"type": "string"}}}, [])],
     [{"h": {"xs": ["", ["a b", "c"]]}}],
     [[["h", {"xs": []}]], [["h", {"xs": ["AB", "C"]}]], [["h", {"xs": ["c", "a b"]}]], [["h", {}]]]),
    # no int -> float inside lists, unless "" makes the item check pass
    ("simple_python", [_fn("k", {"v": {"type": "array", "items": {"type": "float"}}}, ["v"])],
     [{"k": {"v": [[1.0, 2.0]]}}], [[["k", {"v": [1, 2]}]], [["k", {"v": [1.0, 2.0]}]]]),
    ("simple_python", [_fn("k2", {"v": {"type": "array", "items": {"type": "float"}}}, [])],
     [{"k2": {"v": ["", [1.0, 2.0]]}}], [[["k2", {"v": [1, 2]}]], [["k2", {"v": [1, 3]}]]]),
    # "any" is a string; tuples are lists
    ("simple_python", [_fn("a", {"q": {"type": "any"}, "t": {"type": "tuple", "items": {"type": "integer"}}}, ["q"])],
     [{"a": {"q": ["abc"], "t": ["", [1, 2]]}}],
     [[["a", {"q": "A-B-C"}]], [["a", {"q": 5}]], [["a", {"q": "abc", "t": [1, 2]}]], [["a", {"q": "abc", "t": [2, 1]}]]]),
    # dicts: optional keys, normalised values, unknown keys
    ("simple_python", [_fn("d", {"o": {"type": "dict", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}},
                           ["o"])], [{"d": {"o": [{"a": ["x y", ""], "b": [1]}]}}],
     [[["d", {"o": {"b": 1}}]], [["d", {"o": {"a": "X Y", "b": 1}}]], [["d", {"o": {"a": "z", "b": 1}}]],
      [["d", {"o": {}}]], [["d", {"o": {"b": 1, "c": 2}}]], [["d", {"o": "b=1"}]]]),
    # a float parameter whose possible values are written as ints
    ("simple_python", [_fn("m", {"r": {"type": "float"}}, ["r"])], [{"m": {"r": [5]}}],
     [[["m", {"r": 5}]], [["m", {"r": 5.0}]], [["m", {"r": 5.5}]], [["m", {"r": "5"}]]]),
    # booleans are not integers, nor integers booleans
    ("simple_python", [_fn("b", {"on": {"type": "boolean"}, "n": {"type": "integer"}}, ["on"])],
     [{"b": {"on": [True], "n": ["", 1]}}],
     [[["b", {"on": 1}]], [["b", {"on": True}]], [["b", {"on": True, "n": True}]], [["b", {"on": True, "n": 1.0}]]]),
    # a list of dicts, "" standing for the empty list
    ("simple_python", [_fn("ld", {"rows": {"type": "array", "items": {"type": "dict"}}}, [])],
     [{"ld": {"rows": [[{"k": ["v"]}], ""]}}],
     [[["ld", {"rows": []}]], [["ld", {"rows": [{"k": "V"}]}]], [["ld", {"rows": [{"k": "w"}]}]],
      [["ld", {"rows": [{"k": "v"}, {"k": "v"}]}]]]),
    # string normalisation: spaces and ,./-_*^ dropped, case folded, ' read as "
    ("simple_python", [_fn("s", {"city": {"type": "string"}}, ["city"])], [{"s": {"city": ["New York, NY"]}}],
     [[["s", {"city": "newyork ny"}]], [["s", {"city": "New-York/NY."}]], [["s", {"city": "New York City"}]]]),
    # a required parameter the answer leaves out: nothing is accepted
    ("simple_python", [_fn("r", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a"])], [{"r": {"b": [1]}}],
     [[["r", {"b": 1}]], [["r", {"a": 1, "b": 1}]]]),
    # multiple: the call must be to the answer's function; one call only
    ("multiple", [_fn("p.q", {"x": {"type": "integer"}}, ["x"]), _fn("p.r", {"x": {"type": "integer"}}, ["x"])],
     [{"p.q": {"x": [1]}}], [[["p_q", {"x": 1}]], [["p_r", {"x": 1}]], [["p.q", {"x": 1}]],
                             [["p_q", {"x": 1}], ["p_r", {"x": 1}]]]),
]


def _strip_descriptions(value):
    """Function documents without descriptions (neither checker reads them; the fixture is half the size)."""
    if isinstance(value, dict):
        return {k: _strip_descriptions(v) for k, v in value.items() if k != "description"}
    if isinstance(value, list):
        return [_strip_descriptions(v) for v in value]
    return value


def build(data_dir: Path | None, tasks_per_category: int, per_task: int, seed: int) -> tuple[dict, list]:
    from agentrl.envs.bfcl import default_data_dir, load_category

    root = data_dir or default_data_dir()
    tasks, cases = {}, []
    rng = random.Random(seed)
    for category in (*AST_CATEGORIES, "irrelevance"):
        rows = load_category(root, category)
        for row in rng.sample(rows, min(tasks_per_category, len(rows))):
            task = {"id": row["id"], "category": category, "question": row["question"],
                    "function": _strip_descriptions(row["function"]), "possible_answer": row["ground_truth"]}
            tasks[row["id"]] = task
            for label, calls in task_cases(copy.deepcopy(task), rng, per_task):
                cases.append({"case": f"{row['id']}#{len(cases)}", "task": row["id"], "perturbation": label,
                              "calls": calls})
    for i, (category, functions, answer, variants) in enumerate(SYNTHETIC):
        tid = f"synthetic_{i}"
        tasks[tid] = {"id": tid, "category": category, "question": [[{"role": "user", "content": "(synthetic)"}]],
                      "function": functions, "possible_answer": answer}
        for calls in variants:
            cases.append({"case": f"{tid}#{len(cases)}", "task": tid, "perturbation": "synthetic", "calls": calls})
    return tasks, cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bfcl-python", default=sys.executable, help="an interpreter with bfcl_eval installed")
    ap.add_argument("--data-dir", type=Path, default=None, help="BFCL data (default: the bfcl-eval package's)")
    ap.add_argument("--tasks-per-category", type=int, default=30)
    ap.add_argument("--per-task", type=int, default=7, help="perturbations per task, besides two right answers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the fixture (tasks, cases, BFCL's verdicts)")
    ap.add_argument("--bfcl-side", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bfcl_side:
        return bfcl_side()
    from agentrl.envs.bfcl_check import check  # here: BFCL's interpreter need not have agentrl
    tasks, cases = build(args.data_dir, args.tasks_per_category, args.per_task, args.seed)
    proc = subprocess.run([args.bfcl_python, os.path.abspath(__file__), "--bfcl-side"], text=True,
                          input=json.dumps({"tasks": tasks, "cases": cases}), capture_output=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"BFCL's side failed ({args.bfcl_python}):\n{proc.stderr[-3000:]}")
    answer = json.loads(proc.stdout)
    by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    disagreements = []
    for case, verdict in zip(cases, answer["verdicts"]):
        case["bfcl"], case["bfcl_error_type"] = verdict["valid"], verdict["error_type"]
        task = tasks[case["task"]]
        mine = check(task["category"], task["function"], task["possible_answer"], [tuple(c) for c in case["calls"]])
        agree = mine.valid == verdict["valid"]
        c = by_kind[case["perturbation"]]
        c["n"] += 1
        c["accepted"] += bool(verdict["valid"])
        c["agree"] += agree
        if verdict["valid"] is False and not mine.valid:  # both reject: for the same reason?
            c["rejected_both"] += 1
            c["same_error_type"] += mine.error_type == verdict["error_type"]
        if not agree:
            disagreements.append((case, mine))
    n, agree = len(cases), sum(c["agree"] for c in by_kind.values())
    print(f"BFCL side: {answer['mode']}; {len(tasks)} tasks, {n} cases")
    print(f"{'perturbation':28s} {'cases':>5s} {'BFCL accepts':>12s} {'agree':>5s}")
    for kind, c in sorted(by_kind.items()):
        print(f"{kind:28s} {c['n']:5d} {c['accepted']:12d} {c['agree']:5d}")
    print(f"agreement: {agree}/{n}")
    both = sum(c["rejected_both"] for c in by_kind.values())
    print(f"same error type where both reject: {sum(c['same_error_type'] for c in by_kind.values())}/{both}")
    for case, mine in disagreements:
        print(f"DISAGREE {case['case']} {case['perturbation']}: BFCL {case['bfcl']} ({case['bfcl_error_type']}), "
              f"agentrl {mine.valid} ({mine.error_type}); calls {json.dumps(case['calls'])[:300]}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(json.dumps({"kind": "meta", "bfcl": answer["mode"], "bfcl_eval": "2026.3.23", "seed": args.seed,
                                "model": MODEL}) + "\n")
            for task in tasks.values():
                f.write(json.dumps({"kind": "task", **{k: v for k, v in task.items() if k != "question"}}, separators=(",", ":")) + "\n")
            for case in cases:
                f.write(json.dumps({"kind": "case", **case}, separators=(",", ":")) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

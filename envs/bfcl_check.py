"""BFCL's AST checker, re-implemented: is a model's function calls an accepted answer?

This follows ``bfcl_eval/eval_checker/ast_eval/ast_checker.py`` (bfcl-eval 2026.3.23, Python
categories) decision for decision, including its quirks, so that a reward here is the verdict
BFCL would give; ``benchmarks/bfcl_crosscheck.py`` compares the two on perturbed answers and
``tests/test_bfcl_crosscheck.py`` replays the recorded verdicts. The rules:

1. **Count and dispatch.** ``simple``: exactly one call. ``multiple``: as many calls as
   answers (one), checked against the answer's function. ``parallel`` and
   ``parallel_multiple``: as many calls as answers, in any order: each answer, in the answer
   file's order, takes the first call not yet taken that it accepts (greedy, as BFCL does: an
   assignment that only a different pairing would find is not searched for). ``irrelevance``:
   right exactly when there is no call (:func:`check_irrelevance`).
2. **Function name.** The call's name must be the answer function's name with ``.`` written
   ``_`` (tool names cannot hold dots: BFCL's ``underscore_to_dot`` for OpenAI-style models).
3. **Arguments.** Every required parameter is present; every argument is a parameter of the
   function *and* of the answer (one the answer leaves out is "unexpected"); every parameter
   of the answer that the call leaves out has ``""`` (optional) among its possible values.
4. **Types** (BFCL name -> Python): ``string`` str, ``integer`` int, ``float`` float,
   ``boolean`` bool, ``array``/``tuple`` list, ``dict`` dict, ``any`` str; compared by exact
   type (``true`` is no integer, ``1.0`` is no integer). One coercion: an int for a ``float``
   parameter becomes a float. The items of an array are type-checked one level deep, against
   each possible list (an ``""`` option passes that check). When the possible values are of
   another type than the parameter's (BFCL writes variables that way) a value of that type is
   accepted and then compared exactly.
5. **Values.** The value must equal one of the parameter's possible values. Strings (alone,
   as list items, as dict values) are compared after BFCL's normalisation: spaces and
   ``,./-_*^`` removed, lower-cased, ``'`` read as ``"`` (:func:`normalise`). A dict must have
   only keys of one possible dict, with accepted values, and every key that dict does not
   mark optional; a list of dicts is matched position by position.

Example::

    >>> fn = [{"name": "math.hypot", "parameters": {"type": "dict", "required": ["x", "y"],
    ...        "properties": {"x": {"type": "float"}, "y": {"type": "float"}, "z": {"type": "integer"}}}}]
    >>> answer = [{"math.hypot": {"x": [4.0], "y": [5.0], "z": ["", 0]}}]
    >>> check("simple", fn, answer, [("math_hypot", {"x": 4, "y": 5})]).valid
    True
    >>> check("simple", fn, answer, [("math_hypot", {"x": 4, "y": "5"})]).error_type
    'type_error:simple'
    >>> check_irrelevance([]).valid, check_irrelevance([("math_hypot", {})]).valid
    (True, False)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# BFCL's type names -> the Python type a JSON value must have (PYTHON_TYPE_MAPPING)
PYTHON_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool,
                                 "array": list, "tuple": list, "dict": dict, "any": str}
_NESTED = ("array", "tuple")  # types whose items are type-checked (one level deep)
_PUNCTUATION = re.compile(r"[ ,./\-_*^]")

Call = tuple[str, dict[str, Any]]  # (name as the model wrote it, arguments)


@dataclass(frozen=True)
class CheckResult:
    """The checker's decision; ``error_type`` uses BFCL's names (``value_error:string``...)."""

    valid: bool
    error: str = ""
    error_type: str = ""


_OK = CheckResult(True)


def normalise(text: str) -> str:
    """BFCL's string normalisation (``standardize_string``).

    >>> normalise("April 1, 2024") == normalise("april 1 2024"), normalise("It's")
    (True, 'it"s')
    """
    return _PUNCTUATION.sub("", text).lower().replace("'", '"')


def tool_name(name: str) -> str:
    """The name a function is offered (and must be called) under: dots become underscores.

    >>> tool_name("math.factorial")
    'math_factorial'
    """
    return name.replace(".", "_")


def check(category: str, functions: list[dict], possible_answer: list[dict], calls: list[Call]) -> CheckResult:
    """BFCL's verdict on ``calls`` for a task of ``category`` (rules 1-5 of the module docstring).

    ``functions`` are the task's function documents as BFCL writes them (``"type": "float"``...),
    ``possible_answer`` its ``ground_truth`` list (``[{name: {param: [possible values]}}]``).
    """
    if category == "irrelevance":
        return check_irrelevance(calls)
    if not calls:  # a reply without calls is text, which BFCL fails to decode as calls
        return CheckResult(False, "No function call.", "ast_decoder:decoder_failed")
    if any(not isinstance(args, dict) for _, args in calls):
        return CheckResult(False, "Did not output in the specified format.", "ast_decoder:decoder_wrong_output_format")
    if "parallel" in category:
        return _parallel(functions, calls, possible_answer)
    if "multiple" in category:
        if len(calls) != len(possible_answer):
            return CheckResult(False, "Wrong number of functions.", "multiple_function_checker:wrong_count")
        return _function(_find(functions, _expected_name(possible_answer[0])), calls[0], possible_answer[0])
    if len(calls) != 1:
        return CheckResult(False, "Wrong number of functions.", "simple_function_checker:wrong_count")
    return _function(functions[0], calls[0], possible_answer[0])


def check_irrelevance(calls: list[Call]) -> CheckResult:
    """Irrelevance: the only right answer is no call at all. (Calls whose arguments are no
    object count as none, as BFCL's ``is_empty_output`` has it.)"""
    if calls and all(isinstance(args, dict) for _, args in calls):
        return CheckResult(False, "Valid syntax. Successfully decode AST when it should not.",
                           "irrelevance_error:decoder_success")
    return _OK


def _expected_name(answer: dict) -> str:
    return next(iter(answer))


def _find(functions: list[dict], name: str) -> dict:
    for f in functions:
        if f["name"] == name:
            return f
    raise KeyError(f"the answer names function {name!r}, which the task does not offer")


def _parallel(functions: list[dict], calls: list[Call], answers: list[dict]) -> CheckResult:
    if len(calls) != len(answers):
        return CheckResult(False, "Wrong number of functions.", "parallel_function_checker_no_order:wrong_count")
    taken: set[int] = set()
    for i, answer in enumerate(answers):
        fn = _find(functions, _expected_name(answer))
        found = next((k for k, call in enumerate(calls) if k not in taken and _function(fn, call, answer).valid), None)
        if found is None:
            return CheckResult(False, f"Could not find a matching function for index {i} of possible answers.",
                               "parallel_function_checker_no_order:cannot_find_match")
        taken.add(found)
    return _OK


def _function(fn: dict, call: Call, answer: dict) -> CheckResult:
    """One call against one function document and one answer (``simple_function_checker``)."""
    options = next(iter(answer.values()))
    name, params = call
    props, required = fn["parameters"]["properties"], fn["parameters"].get("required", [])
    if name != tool_name(fn["name"]):
        return CheckResult(False, f"Function name {tool_name(fn['name'])!r} not found in model output.",
                           "simple_function_checker:wrong_func_name")
    for p in required:
        if p not in params:
            return CheckResult(False, f"Missing required parameter: {p!r}.", "simple_function_checker:missing_required")
    for p, value in params.items():
        if p not in props or p not in options:
            return CheckResult(False, f"Unexpected parameter: {p!r}.", "simple_function_checker:unexpected_param")
        kind = props[p]["type"]
        expected = PYTHON_TYPES[kind]
        items = props[p].get("items", {}).get("type") if kind in _NESTED else None
        nested = PYTHON_TYPES[items] if items is not None else None
        if kind == "float" and type(value) is int:  # Python's int -> float; the one coercion
            value = float(value)
        typed, variable = _type_check(p, value, options[p], expected, nested)
        if not typed.valid:
            return typed
        if not variable:  # a variable is compared as written, below
            if expected is dict:
                res = _dict(p, value, options[p])
            elif expected is list and nested is dict:
                res = _list_of_dicts(p, value, options[p])
            elif expected is str:
                ok = normalise(value) in [normalise(o) for o in options[p] if type(o) is str]
                res = _OK if ok else CheckResult(False, f"Invalid value for parameter {p!r}: {value!r}.",
                                                 "value_error:string")
            elif expected is list:
                res = _list(p, value, options[p])
            else:
                res = None
            if res is not None:
                if not res.valid:
                    return res
                continue
        if value not in options[p]:
            return CheckResult(False, f"Invalid value for parameter {p!r}: {value!r}.", "value_error:others")
    for p, values in options.items():
        if p not in params and "" not in values:
            return CheckResult(False, f"Optional parameter {p!r} not provided and not marked as optional.",
                               "simple_function_checker:missing_optional")
    return _OK


def _answer_type(options: list) -> type | None:
    """The type of the first possible value that is not the optional marker ``""``."""
    return next((type(o) for o in options if o != ""), None)


def _type_check(p: str, value: Any, options: list, expected: type,
                nested: type | None) -> tuple[CheckResult, bool]:
    """Rule 4 (``type_checker``): the verdict, and whether the value is a "variable" (the
    possible values are of another type than the parameter's; it is then compared exactly)."""
    answer_type = _answer_type(options)
    variable = answer_type is not None and answer_type is not expected
    nested_failed = False
    if type(value) is expected:
        if nested is None:
            return _OK, variable
        for option in options:
            # each possible list checks every item; an option that is no list passes (BFCL's loop)
            if type(option) is not list or all(_type_check(p, v, option, nested, None)[0].valid for v in value):
                return _OK, variable
        nested_failed = True
    if nested_failed:
        return CheckResult(False, f"Nested type checking failed for parameter {p!r}.", "type_error:nested"), variable
    if answer_type is not None and type(value) is answer_type:
        return _OK, True
    return CheckResult(False, f"Incorrect type for parameter {p!r}: got {type(value).__name__} {value!r}.",
                       "type_error:simple"), variable


def _norm(value: Any) -> Any:
    return normalise(value) if type(value) is str else value


def _list(p: str, value: list, options: list) -> CheckResult:
    # BFCL normalises each option item by item; iterating an option that is a string (the
    # optional marker "") gives its characters, so "" stands for the empty list.
    got = [_norm(v) for v in value]
    accepted = [[_norm(x) for x in o] for o in options if isinstance(o, (list, str))]
    if got in accepted:
        return _OK
    return CheckResult(False, f"Invalid value for parameter {p!r}: {value!r}.", "value_error:list/tuple")


def _dict(p: str, value: Any, options: list) -> CheckResult:
    result = CheckResult(False, f"Invalid value for parameter {p!r}.", "dict_checker:unclear")
    if not isinstance(value, dict):  # BFCL would raise here; no possible dict accepts it
        return result
    for option in options:
        if option == "" or not isinstance(option, dict):
            continue
        bad = next((k for k in value if k not in option), None)
        if bad is not None:
            result = CheckResult(False, f"Unexpected dict key parameter: {bad!r}.", "value_error:dict_key")
            continue
        wrong = next((k for k, v in value.items() if _norm(v) not in [_norm(x) for x in option[k]]), None)
        if wrong is not None:
            result = CheckResult(False, f"Invalid value for dict key {wrong!r}.", "value_error:dict_value")
            continue
        missing = next((k for k, vals in option.items() if k not in value and "" not in vals), None)
        if missing is not None:
            result = CheckResult(False, f"Missing dict key parameter: {missing!r}.", "value_error:dict_key")
            continue
        return _OK
    return result


def _list_of_dicts(p: str, value: list, options: list) -> CheckResult:
    result = CheckResult(False, f"Invalid value for parameter {p!r}.", "list_dict_checker:unclear")
    for option in options:
        if len(value) != len(option):
            result = CheckResult(False, "Wrong number of dictionaries in the list.", "value_error:list_dict_count")
            continue
        for got, want in zip(value, option):
            result = _dict(p, got, [want])
            if not result.valid:
                break
        else:
            return _OK
    return result

"""BFCL's AST-matching rules (envs/bfcl_check.py's docstring), one hand-written case each."""

from __future__ import annotations

import pytest

from agentrl.envs.bfcl_check import check, check_irrelevance, normalise, tool_name


def fn(name, props, required=()):
    return {"name": name, "parameters": {"type": "dict", "properties": props, "required": list(required)}}


INT, FLOAT, STR, BOOL = ({"type": t} for t in ("integer", "float", "string", "boolean"))
AREA = [fn("geo.area", {"base": INT, "height": INT, "unit": STR}, ["base", "height"])]
AREA_ANSWER = [{"geo.area": {"base": [10], "height": [5], "unit": ["units", ""]}}]


def simple(calls, functions=AREA, answer=AREA_ANSWER, category="simple_python"):
    return check(category, functions, answer, calls)


# rule 1: count and dispatch


def test_simple_needs_exactly_one_call():
    call = ("geo_area", {"base": 10, "height": 5})
    assert simple([call]).valid
    assert simple([call, call]).error_type == "simple_function_checker:wrong_count"
    assert simple([]).error_type == "ast_decoder:decoder_failed"  # no call: a text reply


def test_multiple_checks_the_answers_function_among_several():
    functions = [fn("a", {"x": INT}, ["x"]), fn("b", {"x": INT}, ["x"])]
    answer = [{"b": {"x": [1]}}]
    assert check("multiple", functions, answer, [("b", {"x": 1})]).valid
    assert check("multiple", functions, answer, [("a", {"x": 1})]).error_type == "simple_function_checker:wrong_func_name"
    assert check("multiple", functions, answer, [("b", {"x": 1})] * 2).error_type == "multiple_function_checker:wrong_count"


@pytest.mark.parametrize("category", ["parallel", "parallel_multiple"])
def test_parallel_calls_match_in_any_order_but_all_of_them(category):
    functions = [fn("play", {"artist": STR, "minutes": INT}, ["artist", "minutes"])]
    answer = [{"play": {"artist": ["Taylor Swift"], "minutes": [20]}}, {"play": {"artist": ["Maroon 5"], "minutes": [15]}}]
    a, b = ("play", {"artist": "Taylor Swift", "minutes": 20}), ("play", {"artist": "Maroon 5", "minutes": 15})
    assert check(category, functions, answer, [a, b]).valid and check(category, functions, answer, [b, a]).valid
    assert check(category, functions, answer, [a]).error_type.endswith(":wrong_count")
    assert check(category, functions, answer, [a, a]).error_type.endswith(":cannot_find_match")


def test_parallel_matching_is_greedy_as_bfcls():
    functions = [fn("f", {"x": INT}, ["x"])]
    answer = [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}]
    # the first answer takes x=1, leaving x=2 for the second, which only accepts 1
    assert not check("parallel", functions, answer, [("f", {"x": 1}), ("f", {"x": 2})]).valid
    assert check("parallel", functions, answer, [("f", {"x": 2}), ("f", {"x": 1})]).valid


def test_irrelevance_is_right_only_without_a_call():
    assert check_irrelevance([]).valid
    assert check("irrelevance", AREA, None, []).valid
    assert check("irrelevance", AREA, None, [("geo_area", {})]).error_type == "irrelevance_error:decoder_success"


def test_arguments_that_are_no_object_are_no_call():
    assert not simple([("geo_area", ["10", "5"])]).valid
    assert check_irrelevance([("geo_area", "10")]).valid  # BFCL's is_empty_output


# rule 2: names


def test_names_are_called_with_dots_as_underscores():
    assert tool_name("geo.area") == "geo_area"
    assert not simple([("geo.area", {"base": 10, "height": 5})]).valid
    assert simple([("geo_areas", {"base": 10, "height": 5})]).error_type == "simple_function_checker:wrong_func_name"


# rule 3: which arguments


def test_required_unexpected_and_optional_arguments():
    assert simple([("geo_area", {"base": 10})]).error_type == "simple_function_checker:missing_required"
    assert simple([("geo_area", {"base": 10, "height": 5, "depth": 1})]).error_type == \
        "simple_function_checker:unexpected_param"
    assert simple([("geo_area", {"base": 10, "height": 5, "unit": "units"})]).valid  # optional, given right
    answer = [{"geo.area": {"base": [10], "height": [5], "unit": ["cm"]}}]  # not marked optional: must be given
    assert simple([("geo_area", {"base": 10, "height": 5})], answer=answer).error_type == \
        "simple_function_checker:missing_optional"


def test_a_parameter_the_answer_leaves_out_is_unexpected():
    answer = [{"geo.area": {"base": [10], "height": [5]}}]
    assert simple([("geo_area", {"base": 10, "height": 5, "unit": "cm"})], answer=answer).error_type == \
        "simple_function_checker:unexpected_param"


# rule 4: types


def test_types_are_exact_with_one_coercion_int_to_float():
    functions = [fn("m", {"r": FLOAT, "n": INT, "on": BOOL}, ["r"])]
    answer = [{"m": {"r": [2.0], "n": ["", 3], "on": ["", True]}}]
    ok = lambda args: check("simple_python", functions, answer, [("m", args)])  # noqa: E731
    assert ok({"r": 2}).valid and ok({"r": 2.0}).valid
    assert ok({"r": 2, "n": 3.0}).error_type == "type_error:simple"  # no float -> int
    assert ok({"r": 2, "n": True}).error_type == "type_error:simple"  # a bool is no integer
    assert ok({"r": 2, "on": 1}).error_type == "type_error:simple"
    assert ok({"r": "2"}).error_type == "type_error:simple"
    assert ok({"r": None}).error_type == "type_error:simple"


def test_array_items_are_type_checked_without_coercion():
    functions = [fn("k", {"v": {"type": "array", "items": FLOAT}}, ["v"])]
    assert not check("simple_python", functions, [{"k": {"v": [[1.0, 2.0]]}}], [("k", {"v": [1, 2]})]).valid
    assert check("simple_python", functions, [{"k": {"v": [[1.0, 2.0]]}}], [("k", {"v": [1.0, 2.0]})]).valid
    # an optional marker among the possible values passes the item check (BFCL's loop); values then compare ==
    assert check("simple_python", functions, [{"k": {"v": ["", [1.0, 2.0]]}}], [("k", {"v": [1, 2]})]).valid


def test_tuple_and_any_types():
    functions = [fn("a", {"q": {"type": "any"}, "t": {"type": "tuple", "items": INT}}, ["q"])]
    answer = [{"a": {"q": ["abc"], "t": ["", [1, 2]]}}]
    assert check("simple_python", functions, answer, [("a", {"q": "A-B-C", "t": [1, 2]})]).valid
    assert not check("simple_python", functions, answer, [("a", {"q": 5})]).valid


def test_possible_values_of_another_type_are_variables_compared_exactly():
    functions = [fn("g", {"n": INT}, ["n"])]
    answer = [{"g": {"n": ["size"]}}]
    assert check("simple_python", functions, answer, [("g", {"n": "size"})]).valid
    assert not check("simple_python", functions, answer, [("g", {"n": "Size"})]).valid  # no normalisation
    assert not check("simple_python", functions, answer, [("g", {"n": 5})]).valid


# rule 5: values


def test_strings_are_normalised_as_bfcl_does():
    assert normalise("New York, NY") == normalise("newyork ny") == normalise("New-York/NY.") == "newyorkny"
    assert normalise("It's") == 'it"s'
    functions = [fn("s", {"city": STR}, ["city"])]
    answer = [{"s": {"city": ["New York, NY"]}}]
    assert check("simple_python", functions, answer, [("s", {"city": "NEW YORK NY"})]).valid
    assert check("simple_python", functions, answer, [("s", {"city": "New York City"})]).error_type == \
        "value_error:string"


def test_numbers_must_be_one_of_the_possible_values():
    assert simple([("geo_area", {"base": 11, "height": 5})]).error_type == "value_error:others"
    answer = [{"geo.area": {"base": [10, 20], "height": [5], "unit": [""]}}]
    assert simple([("geo_area", {"base": 20, "height": 5})], answer=answer).valid


def test_lists_compare_in_order_with_items_normalised_and_empty_for_optional():
    functions = [fn("h", {"xs": {"type": "array", "items": STR}})]
    answer = [{"h": {"xs": ["", ["a b", "c"]]}}]
    call = lambda xs: check("simple_python", functions, answer, [("h", {"xs": xs})])  # noqa: E731
    assert call(["AB", "C"]).valid and call([]).valid
    assert call(["c", "a b"]).error_type == "value_error:list/tuple"


def test_dicts_need_known_keys_right_values_and_every_key_not_optional():
    functions = [fn("d", {"o": {"type": "dict", "properties": {"a": STR, "b": INT}}}, ["o"])]
    answer = [{"d": {"o": [{"a": ["x y", ""], "b": [1]}]}}]
    call = lambda o: check("simple_python", functions, answer, [("d", {"o": o})])  # noqa: E731
    assert call({"b": 1}).valid and call({"a": "X Y", "b": 1}).valid
    assert call({"a": "z", "b": 1}).error_type == "value_error:dict_value"
    assert call({"a": "x y"}).error_type == "value_error:dict_key"
    assert call({"b": 1, "c": 2}).error_type == "value_error:dict_key"


def test_lists_of_dicts_match_position_by_position():
    functions = [fn("ld", {"rows": {"type": "array", "items": {"type": "dict"}}})]
    answer = [{"ld": {"rows": [[{"k": ["v"]}, {"k": ["w"]}], ""]}}]
    call = lambda rows: check("simple_python", functions, answer, [("ld", {"rows": rows})])  # noqa: E731
    assert call([{"k": "V"}, {"k": "w"}]).valid and call([]).valid
    assert not call([{"k": "w"}, {"k": "v"}]).valid
    assert not call([{"k": "v"}]).valid

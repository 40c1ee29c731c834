import json

import pytest
from minijson import dumps


def test_scalars():
    assert dumps(None) == "null"
    assert dumps(True) == "true"
    assert dumps(False) == "false"
    assert dumps(0) == "0"
    assert dumps(-17) == "-17"
    assert dumps(2.5) == "2.5"
    assert dumps(1e100) == "1e+100"
    assert dumps("hi") == '"hi"'


def test_floats_must_be_finite():
    for bad in [float("nan"), float("inf"), float("-inf")]:
        with pytest.raises(ValueError):
            dumps(bad)
        with pytest.raises(ValueError):
            dumps([1, bad])


def test_string_escaping():
    assert dumps('say "hi"') == r'"say \"hi\""'
    assert dumps("back\\slash") == r'"back\\slash"'
    assert dumps("a/b") == '"a/b"'
    assert dumps("line\nbreak\ttab\r\b\f") == r'"line\nbreak\ttab\r\b\f"'
    assert dumps("\x00\x1f\x7f") == r'"\u0000\u001f\u007f"'


def test_non_ascii():
    assert dumps("café") == r'"caf\u00e9"'
    assert dumps("€") == r'"\u20ac"'
    assert dumps("\U0001F600") == r'"\ud83d\ude00"'
    assert dumps("café", ensure_ascii=False) == '"café"'
    assert dumps("\U0001F600", ensure_ascii=False) == '"\U0001F600"'
    assert dumps("~") == '"~"'
    assert dumps("\uffff") == r'"\uffff"'
    assert dumps("\U00010000") == r'"\ud800\udc00"'


def test_containers_compact():
    assert dumps([]) == "[]"
    assert dumps({}) == "{}"
    assert dumps([1, "a", None]) == '[1, "a", null]'
    assert dumps((1, 2)) == "[1, 2]"
    assert dumps({"a": 1, "b": [True, False]}) == '{"a": 1, "b": [true, false]}'
    assert dumps({"b": 1, "a": 2}) == '{"b": 1, "a": 2}'
    assert dumps({"b": 1, "a": 2}, sort_keys=True) == '{"a": 2, "b": 1}'


def test_indent():
    value = {"name": "x", "tags": ["a", "b"], "empty": [], "obj": {"k": None}}
    expected = (
        '{\n'
        '  "name": "x",\n'
        '  "tags": [\n'
        '    "a",\n'
        '    "b"\n'
        '  ],\n'
        '  "empty": [],\n'
        '  "obj": {\n'
        '    "k": null\n'
        '  }\n'
        '}'
    )
    assert dumps(value, indent=2) == expected
    assert dumps([1], indent=4) == "[\n    1\n]"
    assert dumps([], indent=2) == "[]"


def test_matches_stdlib():
    values = [
        {"z": [1, 2.5, {"y": None}], "a": "q\"uote", "m": {"n": {"o": []}}, "u": "ünï\U0001F600"},
        [[], {}, [[1], [2, [3]]], "\x01", -0.0, 10**20],
        "plain",
    ]
    for value in values:
        assert dumps(value) == json.dumps(value)
        assert dumps(value, sort_keys=True) == json.dumps(value, sort_keys=True)
        assert dumps(value, indent=3) == json.dumps(value, indent=3)
        assert dumps(value, ensure_ascii=False) == json.dumps(value, ensure_ascii=False)


def test_type_errors():
    with pytest.raises(TypeError):
        dumps({1: "a"})
    with pytest.raises(TypeError):
        dumps({"a": {("t",): 1}})
    with pytest.raises(TypeError):
        dumps(object())
    with pytest.raises(TypeError):
        dumps({"s": {1, 2}})


def test_circular_references():
    a = []
    a.append(a)
    with pytest.raises(ValueError):
        dumps(a)
    d = {}
    d["self"] = [d]
    with pytest.raises(ValueError):
        dumps(d)
    shared = [1]
    assert dumps([shared, shared]) == "[[1], [1]]"

import json

import pytest
from minijson import JSONError, line_col, loads


def test_scalars():
    assert loads("1") == 1
    assert loads("-2.5") == -2.5
    assert loads('"x"') == "x"
    assert loads("true") is True
    assert loads("false") is False
    assert loads("null") is None
    assert loads("  42  ") == 42


def test_containers():
    assert loads("[]") == []
    assert loads("{}") == {}
    assert loads("[1, 2, 3]") == [1, 2, 3]
    assert loads('{"a": 1, "b": [true, null]}') == {"a": 1, "b": [True, None]}
    assert loads('[[[]], {"x": {}}]') == [[[]], {"x": {}}]


def test_object_keeps_order_and_last_duplicate():
    value = loads('{"b": 1, "a": 2, "b": 3}')
    assert value == {"b": 3, "a": 2}
    assert list(value) == ["b", "a"]


def test_matches_stdlib_on_valid_documents():
    docs = [
        '{"name": "minijson", "version": [1, 2, 3], "stable": false, "deps": null}',
        '[0, -1, 1.5e10, "\\u00fc", {"nested": [[], {}, [{"deep": true}]]}]',
        '  {"k\\"ey": "va\\\\lue", "emoji": "\\ud83d\\ude00", "tab": "\\t"}  ',
        '{"a": {"b": {"c": {"d": [1, [2, [3, [4]]]]}}}}',
    ]
    for doc in docs:
        assert loads(doc) == json.loads(doc)


def expect_error(text, pos, fragment=None, **kwargs):
    with pytest.raises(JSONError) as info:
        loads(text, **kwargs)
    assert info.value.pos == pos, (text, info.value)
    if fragment:
        assert fragment in str(info.value)
    return info.value


def test_errors_in_arrays():
    expect_error("[1, 2", 5, "expected ',' or ']'")
    expect_error("[1 2]", 3, "expected ',' or ']'")
    expect_error("[1, 2,]", 6, "trailing comma")
    expect_error("[,]", 1, "unexpected ','")


def test_errors_in_objects():
    expect_error('{"a" 1}', 5, "expected ':'")
    expect_error('{"a": 1,}', 8, "trailing comma")
    expect_error("{1: 2}", 1, "expected string key")
    expect_error('{"a": 1 "b": 2}', 8, "expected ',' or '}'")
    expect_error('{"a":}', 5, "unexpected '}'")
    expect_error('{"a": 1', 7, "expected ',' or '}'")


def test_errors_at_top_level():
    expect_error("", 0, "unexpected end of input")
    expect_error("   ", 3, "unexpected end of input")
    expect_error("[1] [2]", 4, "extra data")
    expect_error("01", 1, "extra data")
    expect_error("]", 0, "unexpected ']'")


def test_error_line_and_column():
    err = expect_error('{\n  "a": 1,\n  "b" 2\n}', 18)
    assert (err.line, err.col) == (3, 7)
    assert err.msg == "expected ':'"
    assert "line 3 column 7 (char 18)" in str(err)
    err = expect_error("[true,\n @]", 8)
    assert (err.line, err.col) == (2, 2)


def test_line_col():
    text = "ab\ncd\n\nef"
    assert line_col(text, 0) == (1, 1)
    assert line_col(text, 1) == (1, 2)
    assert line_col(text, 2) == (1, 3)
    assert line_col(text, 3) == (2, 1)
    assert line_col(text, 6) == (3, 1)
    assert line_col(text, 8) == (4, 2)
    assert line_col("\n\nx", 2) == (3, 1)
    assert line_col("\nab", 2) == (2, 2)


def test_max_depth():
    assert loads("[" * 5 + "]" * 5, max_depth=5) == [[[[[]]]]]
    expect_error("[" * 6 + "]" * 6, 5, "nesting too deep", max_depth=5)
    with pytest.raises(JSONError):
        loads('{"a": {"b": {}}}', max_depth=2)
    assert loads('{"a": {"b": {}}}', max_depth=3) == {"a": {"b": {}}}
    assert loads("[[1], [2], [3]]", max_depth=2) == [[1], [2], [3]]
    expect_error("[[1], [[2]]]", 7, "nesting too deep", max_depth=2)
    assert loads("[" * 100 + "]" * 100) == loads("[" * 100 + "]" * 100, max_depth=100)
    expect_error("[" * 101 + "]" * 101, 100, "nesting too deep")

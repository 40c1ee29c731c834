from minijson import dumps, loads

VALUES = [
    None,
    True,
    0,
    -123456789012345678901234567890,
    3.141592653589793,
    "",
    "quote \" backslash \\ slash / newline \n nul \x00 tab \t",
    "ünïcödé and astral \U0001F600\U0001D11E",
    [],
    {},
    [1, [2, [3, [4, [5]]]]],
    {"a": {"b": {"c": [None, False, "x"]}}, "": "empty key", "key with \"quotes\"": 1.5e-7},
]


def test_roundtrip_compact():
    for value in VALUES:
        assert loads(dumps(value)) == value


def test_roundtrip_pretty_and_sorted():
    for value in VALUES:
        assert loads(dumps(value, indent=2, sort_keys=True)) == value
        assert loads(dumps(value, ensure_ascii=False)) == value


def test_text_roundtrip_is_stable():
    doc = '{"b": [1, 2.0, "\\u00e9"], "a": {"nested": [true, null]}}'
    once = dumps(loads(doc))
    assert once == doc
    assert dumps(loads(once)) == once
    pretty = dumps(loads(doc), indent=2)
    assert dumps(loads(pretty), indent=2) == pretty


def test_tuples_come_back_as_lists():
    assert loads(dumps((1, (2, 3)))) == [1, [2, 3]]

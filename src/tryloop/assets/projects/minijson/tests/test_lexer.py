import pytest
from minijson import JSONError, Token, tokenize


def kinds(text):
    return [t.kind for t in tokenize(text)]


def test_punctuation_and_eof():
    assert kinds("{}[]:,") == ["{", "}", "[", "]", ":", ",", "eof"]
    assert tokenize("") == [Token("eof", None, 0)]
    assert tokenize("  \n\t ") == [Token("eof", None, 5)]


def test_token_positions():
    tokens = tokenize('{"a": [1, true]}')
    assert [(t.kind, t.pos) for t in tokens] == [
        ("{", 0), ("string", 1), (":", 4), ("[", 6), ("number", 7), (",", 8), ("literal", 10), ("]", 14),
        ("}", 15), ("eof", 16)]


def test_literals():
    assert [t.value for t in tokenize("true false null")[:3]] == [True, False, None]
    assert tokenize("null")[0] == Token("literal", None, 0)
    with pytest.raises(JSONError) as info:
        tokenize("[nul]")
    assert info.value.pos == 1
    with pytest.raises(JSONError):
        tokenize("True")


def test_numbers():
    values = [t.value for t in tokenize("0 -0 7 42 -13 3.25 -0.5 1e3 2E-2 6.02e+23")[:-1]]
    assert values == [0, 0, 7, 42, -13, 3.25, -0.5, 1000.0, 0.02, 6.02e23]
    assert isinstance(values[2], int)
    assert isinstance(values[7], float)
    assert tokenize("10")[0] == Token("number", 10, 0)


def test_bad_numbers():
    for text, pos in [("-", 1), ("1.", 2), ("1.e5", 2), ("2e", 2), ("3e+", 3), ("-x", 1)]:
        with pytest.raises(JSONError) as info:
            tokenize(text)
        assert info.value.pos == pos, text


def test_leading_zero_splits_number():
    # "01" is two numbers to the lexer; the parser rejects the second one.
    assert [t.value for t in tokenize("01")[:-1]] == [0, 1]


def test_strings_and_escapes():
    assert tokenize('"hi"')[0] == Token("string", "hi", 0)
    assert tokenize('""')[0].value == ""
    assert tokenize(r'"a\"b\\c\/d"')[0].value == 'a"b\\c/d'
    assert tokenize(r'"\b\f\n\r\t"')[0].value == "\b\f\n\r\t"
    assert tokenize(r'"\u00e9\u20AC"')[0].value == "é€"
    assert tokenize(r'"\ud83d\ude00"')[0].value == "\U0001F600"
    assert tokenize(r'"\ud83d x"')[0].value == "\ud83d x"
    assert tokenize(r'"\udbff\udfff"')[0].value == "\U0010FFFF"
    assert tokenize(r'"\ud800\udc00"')[0].value == "\U00010000"
    assert tokenize(r'"\udc00\udc00"')[0].value == "\udc00\udc00"
    assert tokenize(r'"\ud800\ue000"')[0].value == "\ud800\ue000"
    assert tokenize('"x" "y"')[1] == Token("string", "y", 4)


def test_string_errors():
    cases = [('"abc', 0), ('"a\\q"', 2), ('"tab\there"', 4), ('"\\u12g4"', 1), ('"\\u12"', 1), ('"a\\', 0)]
    for text, pos in cases:
        with pytest.raises(JSONError) as info:
            tokenize(text)
        assert info.value.pos == pos, text


def test_unexpected_character():
    with pytest.raises(JSONError) as info:
        tokenize('{"a": @}')
    assert info.value.pos == 6
    assert "unexpected character '@'" in str(info.value)
    assert info.value.msg == "unexpected character '@'"

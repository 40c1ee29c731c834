import pytest
from textstats import char_ngrams, count_ngrams, most_common, ngrams


def test_ngrams():
    toks = ["a", "b", "c", "d"]
    assert ngrams(toks, 1) == [("a",), ("b",), ("c",), ("d",)]
    assert ngrams(toks, 2) == [("a", "b"), ("b", "c"), ("c", "d")]
    assert ngrams(toks, 3) == [("a", "b", "c"), ("b", "c", "d")]
    assert ngrams(toks, 4) == [("a", "b", "c", "d")]
    assert ngrams(toks, 5) == []
    assert ngrams([], 2) == []
    with pytest.raises(ValueError):
        ngrams(toks, 0)


def test_count_ngrams():
    toks = ["to", "be", "or", "not", "to", "be"]
    assert count_ngrams(toks, 1) == {("to",): 2, ("be",): 2, ("or",): 1, ("not",): 1}
    bigrams = count_ngrams(toks, 2)
    assert bigrams[("to", "be")] == 2
    assert bigrams[("be", "or")] == 1
    assert len(bigrams) == 4
    assert count_ngrams(toks, 7) == {}


def test_most_common():
    counts = {"b": 2, "a": 2, "c": 5, "d": 1}
    assert most_common(counts) == [("c", 5), ("a", 2), ("b", 2), ("d", 1)]
    assert most_common(counts, 2) == [("c", 5), ("a", 2)]
    assert most_common(counts, 0) == []
    assert most_common({}) == []
    assert most_common(counts, 10) == most_common(counts)


def test_char_ngrams():
    assert char_ngrams("cat", 2) == ["_c", "ca", "at", "t_"]
    assert char_ngrams("cat", 3) == ["_ca", "cat", "at_"]
    assert char_ngrams("cat", 5) == ["_cat_"]
    assert char_ngrams("cat", 6) == []
    assert char_ngrams("cat", 2, pad="") == ["ca", "at"]
    assert char_ngrams("ab", 1, pad="#") == ["#", "a", "b", "#"]
    with pytest.raises(ValueError):
        char_ngrams("cat", 0)

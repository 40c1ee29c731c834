import math

import pytest
from textstats import Index, cosine, idf, term_frequency, tfidf

DOCS = [["cat", "sat", "mat"], ["dog", "sat", "log"], ["cat", "cat", "dog"]]


def test_term_frequency():
    assert term_frequency(["a", "b", "a", "c"]) == {"a": 0.5, "b": 0.25, "c": 0.25}
    assert term_frequency(["x"]) == {"x": 1.0}
    assert term_frequency([]) == {}
    assert sum(term_frequency(["p", "q", "q", "r", "s"]).values()) == pytest.approx(1.0)


def test_idf():
    assert idf("cat", DOCS) == pytest.approx(math.log(4 / 3) + 1)
    assert idf("mat", DOCS) == pytest.approx(math.log(4 / 2) + 1)
    assert idf("zebra", DOCS) == pytest.approx(math.log(4) + 1)
    assert idf("sat", DOCS) < idf("log", DOCS)
    assert idf("anything", []) == pytest.approx(1.0)


def test_tfidf():
    weights = tfidf(["cat", "cat", "mat", "sat"], DOCS)
    assert set(weights) == {"cat", "mat", "sat"}
    assert weights["cat"] == pytest.approx(0.5 * (math.log(4 / 3) + 1))
    assert weights["mat"] == pytest.approx(0.25 * (math.log(2) + 1))
    assert weights["mat"] > weights["sat"]
    assert tfidf([], DOCS) == {}


def test_cosine():
    assert cosine({"a": 1.0}, {"a": 2.0}) == pytest.approx(1.0)
    assert cosine({"a": 1.0}, {"b": 1.0}) == 0.0
    assert cosine({"a": 1.0, "b": 1.0}, {"a": 1.0}) == pytest.approx(1 / math.sqrt(2))
    assert cosine({"a": 3.0, "b": 4.0}, {"a": 4.0, "b": 3.0}) == pytest.approx(24 / 25)
    assert cosine({}, {"a": 1.0}) == 0.0
    assert cosine({"a": 1.0}, {}) == 0.0
    assert cosine({"a": 0.0}, {"a": 0.0}) == 0.0


def build_index(stopwords=True):
    index = Index(stopwords=stopwords)
    index.add("pets", "The cat and the dog are friends.")
    index.add("cats", "A cat sat on the mat. The cat purred.")
    index.add("weather", "Rain is expected on Monday and Tuesday.")
    index.add("dogs", "Dogs bark; the dog barked at the cat.")
    return index


def test_index_basics():
    index = build_index()
    assert len(index) == 4
    assert index.docs["cats"] == ["cat", "sat", "mat", "cat", "purred"]
    assert "the" not in index.vocabulary()
    assert index.vocabulary() == sorted(index.vocabulary())
    assert "monday" in index.vocabulary()
    with pytest.raises(KeyError):
        index.add("cats", "again")


def test_index_without_stopword_removal():
    index = build_index(stopwords=False)
    assert "the" in index.vocabulary()
    assert index.docs["cats"][:3] == ["a", "cat", "sat"]


def test_search_ranks_best_first():
    index = build_index()
    results = index.search("cat")
    assert [doc for doc, _ in results] == ["cats", "pets", "dogs"]
    scores = [score for _, score in results]
    assert scores == sorted(scores, reverse=True)
    assert all(0 < s <= 1 for s in scores)


def test_search_limits_and_misses():
    index = build_index()
    assert [doc for doc, _ in index.search("cat", k=1)] == ["cats"]
    assert index.search("giraffe") == []
    assert index.search("the and") == []
    assert index.search("RAIN on MONDAY")[0][0] == "weather"
    assert len(index.search("rain")) == 1
    many = Index()
    for i in range(5):
        many.add(f"d{i}", "x " * (i + 1) + "y")
    assert len(many.search("x")) == 3
    assert len(many.search("x", k=10)) == 5


def test_search_ties_broken_by_id():
    index = Index()
    index.add("b", "apple banana")
    index.add("a", "banana apple")
    index.add("c", "cherry")
    results = index.search("apple banana")
    assert [doc for doc, _ in results] == ["a", "b"]
    assert results[0][1] == pytest.approx(results[1][1])
    assert results[0][1] == pytest.approx(1.0)

from textstats import STOPWORDS, remove_stopwords, sentences, tokenize


def test_tokenize_basic():
    assert tokenize("Hello, world!") == ["hello", "world"]
    assert tokenize("The cat sat.") == ["the", "cat", "sat"]
    assert tokenize("") == []
    assert tokenize("   ...  ") == []
    assert tokenize("word") == ["word"]


def test_tokenize_keeps_case_when_asked():
    assert tokenize("Hello World", lowercase=False) == ["Hello", "World"]
    assert tokenize("Hello World") == ["hello", "world"]


def test_tokenize_numbers_and_separators():
    assert tokenize("room 101, floor 3") == ["room", "101", "floor", "3"]
    assert tokenize("well-known e-mail") == ["well", "known", "e", "mail"]
    assert tokenize("a_b/c") == ["a", "b", "c"]


def test_tokenize_apostrophes():
    assert tokenize("Don't stop") == ["don't", "stop"]
    assert tokenize("it's the dog's") == ["it's", "the", "dog's"]
    assert tokenize("'quoted' words") == ["quoted", "words"]
    assert tokenize("dogs' toys") == ["dogs", "toys"]
    assert tokenize("end'") == ["end"]
    assert tokenize("rock 'n' roll") == ["rock", "n", "roll"]
    assert tokenize("99's") == ["99", "s"]
    assert tokenize("mp3's") == ["mp3", "s"]


def test_remove_stopwords():
    assert remove_stopwords(["the", "cat", "is", "on", "the", "mat"]) == ["cat", "mat"]
    assert remove_stopwords(["The", "Cat"]) == ["Cat"]
    assert remove_stopwords([]) == []
    assert remove_stopwords(["x", "y"], stopwords={"x"}) == ["y"]
    assert "the" in STOPWORDS and "cat" not in STOPWORDS


def test_sentences_basic():
    assert sentences("One. Two! Three?") == ["One.", "Two!", "Three?"]
    assert sentences("No end mark") == ["No end mark"]
    assert sentences("") == []
    assert sentences("   ") == []


def test_sentences_punctuation_inside():
    assert sentences("Pi is 3.14 roughly. Yes.") == ["Pi is 3.14 roughly.", "Yes."]
    assert sentences("Wait... what?! Fine.") == ["Wait...", "what?!", "Fine."]
    assert sentences("Visit example.com today.  Then\nleave.") == ["Visit example.com today.", "Then\nleave."]
    assert sentences("Trailing text. and more") == ["Trailing text.", "and more"]
    assert sentences("!!! Hi.") == ["!!!", "Hi."]
    assert sentences("? Next") == ["?", "Next"]

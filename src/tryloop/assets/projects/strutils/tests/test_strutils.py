import pytest
from strutils import (
    caesar,
    camel_to_snake,
    center,
    count_vowels,
    is_anagram,
    is_palindrome,
    longest_common_prefix,
    reverse_words,
    rle_decode,
    rle_encode,
    slugify,
    snake_to_camel,
    title_case,
    truncate,
    word_count,
)


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  Many   spaces here ") == "many-spaces-here"
    assert slugify("Python 3.11 rocks") == "python-3-11-rocks"


def test_slugify_edges():
    assert slugify("") == ""
    assert slugify("!!!") == ""
    assert slugify("single") == "single"
    assert slugify("a", sep="_") == "a"
    assert slugify("Snake Case Me", sep="_") == "snake_case_me"
    assert slugify("trailing word.") == "trailing-word"


def test_is_palindrome_true():
    assert is_palindrome("racecar")
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert is_palindrome("")
    assert is_palindrome("x")
    assert is_palindrome("abba")
    assert is_palindrome("No 'x' in Nixon")


def test_is_palindrome_false():
    assert is_palindrome("python") is False
    assert is_palindrome("ab") is False
    assert not is_palindrome("abca")
    assert not is_palindrome("abcdba")


def test_word_count():
    assert word_count("the cat and the hat") == {"the": 2, "cat": 1, "and": 1, "hat": 1}
    assert word_count("Go, go, GO!") == {"go": 3}
    assert word_count("") == {}
    assert word_count("one") == {"one": 1}


def test_caesar_shift():
    assert caesar("abc", 1) == "bcd"
    assert caesar("xyz", 3) == "abc"
    assert caesar("Hello, World!", 13) == "Uryyb, Jbeyq!"
    assert caesar("ABC", 0) == "ABC"
    assert caesar("Zebra", 1) == "Afcsb"
    assert caesar("Apple", 1) == "Bqqmf"


def test_caesar_negative_and_roundtrip():
    assert caesar("bcd", -1) == "abc"
    assert caesar("abc", -3) == "xyz"
    assert caesar("abc", 27) == "bcd"
    msg = "Attack at Dawn, 5am!"
    assert caesar(caesar(msg, 7), -7) == msg


def test_rle_encode():
    assert rle_encode("aaab") == "3a1b"
    assert rle_encode("abc") == "1a1b1c"
    assert rle_encode("") == ""
    assert rle_encode("z") == "1z"
    assert rle_encode("aabbbaa") == "2a3b2a"
    assert rle_encode("x" * 12) == "12x"


def test_rle_decode():
    assert rle_decode("3a1b") == "aaab"
    assert rle_decode("12x") == "x" * 12
    assert rle_decode("") == ""
    assert rle_decode("1a2b3c") == "abbccc"


def test_rle_decode_errors():
    with pytest.raises(ValueError):
        rle_decode("a")
    with pytest.raises(ValueError):
        rle_decode("2a3")


def test_rle_roundtrip():
    for text in ["hello", "aaaaaaaaaaab", "mississippi", "  ", "abab"]:
        assert rle_decode(rle_encode(text)) == text


def test_camel_to_snake():
    assert camel_to_snake("camelCase") == "camel_case"
    assert camel_to_snake("CamelCase") == "camel_case"
    assert camel_to_snake("parseHTTPResponse") == "parse_http_response"
    assert camel_to_snake("HTTPServer") == "http_server"
    assert camel_to_snake("already_snake") == "already_snake"
    assert camel_to_snake("version2Name") == "version2_name"
    assert camel_to_snake("ID") == "id"
    assert camel_to_snake("aB") == "a_b"
    assert camel_to_snake("HttpURL") == "http_url"
    assert camel_to_snake("ABc") == "a_bc"
    assert camel_to_snake("XMLHttpRequest") == "xml_http_request"
    assert camel_to_snake("") == ""


def test_snake_to_camel():
    assert snake_to_camel("parse_http_response") == "parseHttpResponse"
    assert snake_to_camel("parse_http_response", upper_first=True) == "ParseHttpResponse"
    assert snake_to_camel("single") == "single"
    assert snake_to_camel("Single") == "single"
    assert snake_to_camel("__double__under__") == "doubleUnder"
    assert snake_to_camel("") == ""
    assert snake_to_camel("a_b", upper_first=True) == "AB"


def test_truncate():
    assert truncate("hello world", 8) == "hello..."
    assert truncate("hello", 5) == "hello"
    assert truncate("hello", 10) == "hello"
    assert truncate("hello world", 6, ellipsis="~") == "hello~"
    assert len(truncate("a" * 50, 20)) == 20


def test_truncate_tiny_width():
    assert truncate("hello", 3) == "..."
    assert truncate("hello", 2) == ".."
    assert truncate("hello", 0) == ""
    assert truncate("hello", 4) == "h..."
    with pytest.raises(ValueError):
        truncate("hello", -1)


def test_count_vowels():
    assert count_vowels("hello") == 2
    assert count_vowels("AEIOU") == 5
    assert count_vowels("rhythm") == 0
    assert count_vowels("") == 0
    assert count_vowels("Programming in Python") == 5


def test_reverse_words():
    assert reverse_words("one two three") == "three two one"
    assert reverse_words("  spaced   out  ") == "out spaced"
    assert reverse_words("solo") == "solo"
    assert reverse_words("") == ""


def test_title_case():
    assert title_case("the lord of the rings") == "The Lord of the Rings"
    assert title_case("a tale of two cities") == "A Tale of Two Cities"
    assert title_case("what are you looking at") == "What Are You Looking At"
    assert title_case("HELLO wORLD") == "Hello World"
    assert title_case("") == ""
    assert title_case("of") == "Of"
    assert title_case("war and peace") == "War and Peace"


def test_is_anagram():
    assert is_anagram("listen", "silent")
    assert is_anagram("Dormitory", "Dirty room")
    assert is_anagram("", "")
    assert not is_anagram("abc", "abd")
    assert not is_anagram("aab", "abb")
    assert not is_anagram("abc", "abcc")


def test_longest_common_prefix():
    assert longest_common_prefix(["flower", "flow", "flight"]) == "fl"
    assert longest_common_prefix(["dog", "racecar", "car"]) == ""
    assert longest_common_prefix(["same", "same"]) == "same"
    assert longest_common_prefix(["alone"]) == "alone"
    assert longest_common_prefix([]) == ""
    assert longest_common_prefix(["prefix", "pre", "prepare"]) == "pre"
    assert longest_common_prefix(["abc", "abd", "xbc"]) == ""
    assert longest_common_prefix(["interview", "in", "internet"]) == "in"


def test_center():
    assert center("hi", 6) == "**hi**"
    assert center("hi", 5) == "*hi**"
    assert center("hello", 3) == "hello"
    assert center("hello", 5) == "hello"
    assert center("x", 4, fill="-") == "-x--"
    with pytest.raises(ValueError):
        center("x", 4, fill="ab")

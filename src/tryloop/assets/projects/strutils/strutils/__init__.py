"""Small, independent string helpers."""

VOWELS = "aeiou"
MINOR_WORDS = {"a", "an", "and", "as", "at", "but", "by", "for", "in", "of", "on", "or", "the", "to"}


def slugify(text, sep="-"):
    """Lowercase `text`, keep letters and digits, join the runs with `sep`.

    >>> slugify("Hello, World!")
    'hello-world'
    """
    words = []
    current = []
    for ch in text.lower():
        if ch.isalnum():
            current.append(ch)
        elif current:
            words.append("".join(current))
            current = []
    if current:
        words.append("".join(current))
    return sep.join(words)


def is_palindrome(text):
    """True if `text` reads the same backwards, ignoring case and non-alphanumerics."""
    chars = [ch.lower() for ch in text if ch.isalnum()]
    i, j = 0, len(chars) - 1
    while i < j:
        if chars[i] != chars[j]:
            return False
        i += 1
        j -= 1
    return True


def word_count(text):
    """Map each lowercase word to how often it occurs. Punctuation is not part of a word."""
    counts = {}
    for word in slugify(text, sep=" ").split():
        counts[word] = counts.get(word, 0) + 1
    return counts


def caesar(text, shift):
    """Shift letters by `shift` places, wrapping around; case is kept, other characters unchanged."""
    out = []
    for ch in text:
        if "a" <= ch <= "z":
            out.append(chr((ord(ch) - ord("a") + shift) % 26 + ord("a")))
        elif "A" <= ch <= "Z":
            out.append(chr((ord(ch) - ord("A") + shift) % 26 + ord("A")))
        else:
            out.append(ch)
    return "".join(out)


def rle_encode(text):
    """Run-length encode: 'aaab' -> '3a1b'."""
    if not text:
        return ""
    out = []
    prev = text[0]
    count = 1
    for ch in text[1:]:
        if ch == prev:
            count += 1
        else:
            out.append(f"{count}{prev}")
            prev = ch
            count = 1
    out.append(f"{count}{prev}")
    return "".join(out)


def rle_decode(code):
    """Inverse of rle_encode: '3a1b' -> 'aaab'. Counts may have several digits."""
    out = []
    digits = ""
    for ch in code:
        if ch.isdigit():
            digits += ch
        else:
            if not digits:
                raise ValueError(f"missing count before {ch!r}")
            out.append(ch * int(digits))
            digits = ""
    if digits:
        raise ValueError("trailing count without a character")
    return "".join(out)


def camel_to_snake(name):
    """'parseHTTPResponse' -> 'parse_http_response'."""
    out = []
    for i, ch in enumerate(name):
        if ch.isupper():
            prev_lower = i > 0 and (name[i - 1].islower() or name[i - 1].isdigit())
            next_lower = i + 1 < len(name) and name[i + 1].islower()
            prev_upper = i > 0 and name[i - 1].isupper()
            if prev_lower or (prev_upper and next_lower):
                out.append("_")
            out.append(ch.lower())
        else:
            out.append(ch)
    return "".join(out)


def snake_to_camel(name, upper_first=False):
    """'parse_http_response' -> 'parseHttpResponse' (or 'ParseHttpResponse')."""
    parts = [p for p in name.split("_") if p]
    if not parts:
        return ""
    head = parts[0].capitalize() if upper_first else parts[0].lower()
    return head + "".join(p.capitalize() for p in parts[1:])


def truncate(text, width, ellipsis="..."):
    """Shorten `text` to at most `width` characters, ending with `ellipsis` when cut."""
    if width < 0:
        raise ValueError("width must be non-negative")
    if len(text) <= width:
        return text
    if width <= len(ellipsis):
        return ellipsis[:width]
    return text[: width - len(ellipsis)] + ellipsis


def count_vowels(text):
    """Number of vowels (a, e, i, o, u) in `text`, either case."""
    return sum(1 for ch in text.lower() if ch in VOWELS)


def reverse_words(text):
    """Reverse the order of the words; runs of whitespace become one space."""
    return " ".join(reversed(text.split()))


def title_case(text):
    """Capitalise each word except minor words, which stay lowercase unless first or last."""
    words = text.split()
    out = []
    for i, word in enumerate(words):
        lower = word.lower()
        if 0 < i < len(words) - 1 and lower in MINOR_WORDS:
            out.append(lower)
        else:
            out.append(lower[:1].upper() + lower[1:])
    return " ".join(out)


def is_anagram(a, b):
    """True if `a` and `b` use the same letters the same number of times (case and spaces ignored)."""
    def key(s):
        return sorted(ch.lower() for ch in s if not ch.isspace())
    return key(a) == key(b)


def longest_common_prefix(words):
    """The longest string that every word starts with ('' for no words)."""
    if not words:
        return ""
    prefix = words[0]
    for word in words[1:]:
        n = 0
        while n < len(prefix) and n < len(word) and prefix[n] == word[n]:
            n += 1
        prefix = prefix[:n]
        if not prefix:
            break
    return prefix


def center(text, width, fill="*"):
    """Pad `text` on both sides to `width`; an odd extra fill character goes on the right."""
    if len(fill) != 1:
        raise ValueError("fill must be a single character")
    total = width - len(text)
    if total <= 0:
        return text
    left = total // 2
    right = total - left
    return fill * left + text + fill * right

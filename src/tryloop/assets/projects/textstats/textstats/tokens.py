"""Splitting text into words and sentences."""

STOPWORDS = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "has", "have", "in", "is", "it",
    "its", "of", "on", "or", "that", "the", "this", "to", "was", "were", "will", "with",
})
SENTENCE_END = ".!?"


def tokenize(text, lowercase=True):
    """Words of `text`: runs of letters and digits; an apostrophe between two letters stays
    inside the word ("don't"), any other character separates words."""
    tokens = []
    current = []
    n = len(text)
    for i, ch in enumerate(text):
        inner_apostrophe = ch == "'" and current and i + 1 < n and text[i + 1].isalpha() and current[-1].isalpha()
        if ch.isalnum() or inner_apostrophe:
            current.append(ch)
        elif current:
            tokens.append("".join(current))
            current = []
    if current:
        tokens.append("".join(current))
    if lowercase:
        tokens = [t.lower() for t in tokens]
    return tokens


def remove_stopwords(tokens, stopwords=STOPWORDS):
    """`tokens` without the stop words (compared case-insensitively), order kept."""
    return [t for t in tokens if t.lower() not in stopwords]


def sentences(text):
    """Split `text` into sentences. A sentence ends at '.', '!' or '?' followed by whitespace or
    the end of the text; runs like '?!' or '...' stay with their sentence. Whitespace is trimmed
    and empty sentences are dropped."""
    out = []
    start = 0
    i = 0
    n = len(text)
    while i < n:
        if text[i] in SENTENCE_END:
            j = i
            while j + 1 < n and text[j + 1] in SENTENCE_END:
                j += 1
            if j + 1 == n or text[j + 1].isspace():
                piece = text[start:j + 1].strip()
                if piece:
                    out.append(piece)
                start = j + 1
            i = j + 1
        else:
            i += 1
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out

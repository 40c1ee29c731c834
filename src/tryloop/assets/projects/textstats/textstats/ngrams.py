"""Word and character n-grams."""


def ngrams(tokens, n):
    """Consecutive runs of `n` tokens, as tuples, in order."""
    if n < 1:
        raise ValueError("n must be at least 1")
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def count_ngrams(tokens, n):
    """How often each n-gram occurs."""
    counts = {}
    for gram in ngrams(tokens, n):
        counts[gram] = counts.get(gram, 0) + 1
    return counts


def most_common(counts, k=None):
    """(item, count) pairs by decreasing count, ties by item; the first `k` only if given."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if k is not None:
        ranked = ranked[:k]
    return ranked


def char_ngrams(word, n, pad="_"):
    """Character n-grams of `word` padded with one `pad` on each side: 'cat', 2 -> _c ca at t_."""
    if n < 1:
        raise ValueError("n must be at least 1")
    padded = f"{pad}{word}{pad}" if pad else word
    return [padded[i:i + n] for i in range(len(padded) - n + 1)]

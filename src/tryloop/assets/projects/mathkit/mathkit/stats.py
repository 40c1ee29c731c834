"""Descriptive statistics over lists of numbers."""


def mean(xs):
    """Arithmetic mean; ValueError for an empty list."""
    if not xs:
        raise ValueError("mean of an empty list")
    return sum(xs) / len(xs)


def median(xs):
    """Middle value of the sorted data; the mean of the two middle values for even lengths."""
    if not xs:
        raise ValueError("median of an empty list")
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    if n % 2 == 1:
        return s[mid]
    return (s[mid - 1] + s[mid]) / 2


def mode(xs):
    """Most common value; ties go to the smallest value."""
    if not xs:
        raise ValueError("mode of an empty list")
    counts = {}
    for x in xs:
        counts[x] = counts.get(x, 0) + 1
    best = None
    best_count = 0
    for value in sorted(counts):
        if counts[value] > best_count:
            best = value
            best_count = counts[value]
    return best


def variance(xs, sample=False):
    """Population variance, or the sample variance (n - 1 in the denominator) if `sample`."""
    n = len(xs)
    if n == 0 or (sample and n < 2):
        raise ValueError("not enough data for a variance")
    m = mean(xs)
    ss = sum((x - m) ** 2 for x in xs)
    return ss / (n - 1 if sample else n)

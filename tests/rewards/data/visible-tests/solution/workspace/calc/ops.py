"""Small numeric helpers, with a command line: `python -m calc.ops 1 2 3` prints the mean."""

import sys


def add(a, b):
    return a + b


def mean(values):
    """Arithmetic mean of a non-empty sequence; ValueError when it is empty."""
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def clamp(x, lo, hi):
    """`x` limited to [lo, hi]."""
    if lo > hi:
        raise ValueError("lo must not exceed hi")
    return max(lo, min(x, hi))


def main(argv):
    if not argv:
        sys.exit("usage: python -m calc.ops NUMBER...")
    print(mean([float(a) for a in argv]))


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)

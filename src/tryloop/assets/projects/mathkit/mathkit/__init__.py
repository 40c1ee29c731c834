"""Number helpers: arithmetic, primes, sequences, searching and statistics."""

from mathkit.arith import (
    clamp,
    digit_sum,
    factorial,
    fibonacci,
    fibonacci_sequence,
    gcd,
    is_perfect,
    lcm,
)
from mathkit.primes import is_prime, prime_factors, primes_up_to
from mathkit.search import binary_search, insertion_point
from mathkit.stats import mean, median, mode, variance

__all__ = [
    "binary_search", "clamp", "digit_sum", "factorial", "fibonacci", "fibonacci_sequence", "gcd",
    "insertion_point", "is_perfect", "is_prime", "lcm", "mean", "median", "mode", "prime_factors",
    "primes_up_to", "variance",
]
